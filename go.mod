module github.com/outpost-edge/outpost

go 1.26

require (
	github.com/cespare/xxhash/v2 v2.3.0
	github.com/stretchr/testify v1.12.1
)

require (
	go.etcd.io/bbolt v1.5.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.45.0 // indirect
)
