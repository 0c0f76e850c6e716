# Outpost: build, run and test. `make help` lists the targets.
SHELL := /bin/bash
# A release tag (v1.2.0, or v1.2.0-3-gabc1234 past it), else dev-COMMIT: a
# bare commit hash of digits alone would read as a version number.
VERSION ?= $(shell git describe --tags --dirty 2>/dev/null || echo dev-$$(git describe --always --dirty 2>/dev/null))
LDFLAGS := -s -w -X main.version=$(VERSION)
DATA ?= ./outpost-data
FUZZTIME ?= 10s
FUZZMINIMIZETIME ?= 1s
GO ?= go

.PHONY: help build run test test-crash bench fuzz fmt lint

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-11s %s\n", $$1, $$2}'

build: ## build the static binary bin/outpost
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/outpost ./cmd/outpost

run: build ## build, then serve the API and console on 127.0.0.1:7070 with the embedded reference bundle, in $(DATA)
	./bin/outpost serve --data $(DATA)

test: ## go vet, then every test with the race detector
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...

test-crash: ## the long crash tests: kill -9 at random moments, many times; a power cut after every write
	OUTPOST_CRASH_KILLS=200 $(GO) test -count=1 -run 'CrashKill9' -timeout 30m -v ./internal/crashtest/
	OUTPOST_POWERCUT_POINTS=0 $(GO) test -count=1 -run 'TestPowerCut' -timeout 30m -v ./store/

bench: build ## go benchmarks, then the reference workload (S1 and S2, in memory and on bbolt; medians of 3 runs)
	$(GO) test -run '^$$' -bench . -benchmem ./...
	./bin/outpost bench reference --saver memory --threads 1 --turns 200 --runs 3
	./bin/outpost bench reference --saver memory --threads 64 --turns 20 --runs 3
	./bin/outpost bench reference --saver bbolt --threads 1 --turns 200 --runs 3
	./bin/outpost bench reference --saver bbolt --threads 64 --turns 20 --runs 3

fuzz: ## a short run of every fuzz target (FUZZTIME each), reporting every failing one (see .ci/fuzz)
	GO=$(GO) FUZZTIME=$(FUZZTIME) FUZZMINIMIZETIME=$(FUZZMINIMIZETIME) .ci/fuzz

fmt: ## gofmt every file
	gofmt -w $$(git ls-files '*.go')

lint: ## gofmt check and go vet
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
