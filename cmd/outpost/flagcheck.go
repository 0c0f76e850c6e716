package main

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/outpost-edge/outpost/bench"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/uplink"
)

// A flag's value that can be checked before a command does anything (makes
// or opens a store, listens, prints its start-up lines) is checked then: a
// value refused there is a bad command line, exit 2, and nothing has been
// done. A small file a flag names (a secret, a key, a certificate) is such
// a value: one that cannot be read, or whose content is refused, is refused
// there too. What only the work itself finds out (a bundle's signature, a
// store's pages, a collector that does not answer) fails the work, exit 1.

// checkListenAddr refuses an address that cannot be listened on: no port,
// or a port that is neither a number up to 65535 nor a service name.
func checkListenAddr(name, addr, example string) error {
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = net.LookupPort("tcp", port)
	}
	if err != nil {
		return badUsage("--%s %q: want HOST:PORT, such as %s (%v)", name, addr, example, err)
	}
	return nil
}

// checkTLSPair loads the certificate and key that --tls-cert and --tls-key
// name, as serve will.
func checkTLSPair(cert, key string) error {
	if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
		return badUsage("--tls-cert %s and --tls-key %s: %v", cert, key, err)
	}
	return nil
}

// checkCollectorURL refuses a collector URL that no batch can be sent to.
func checkCollectorURL(name, u string) error {
	if err := uplink.CheckURL(u); err != nil {
		return badUsage("--%s: %v", name, err)
	}
	return nil
}

// loadSecretFlag reads the appliance's uplink secret from the file the
// flag name gives.
func loadSecretFlag(name, path string) ([]byte, error) {
	secret, err := uplink.LoadSecret(path)
	if err != nil {
		return nil, badUsage("--%s: %v", name, err)
	}
	return secret, nil
}

// checkApplianceIDFlag refuses an --appliance-id that no store takes; ""
// (the flag left out) is the store's own.
func checkApplianceIDFlag(id string) error {
	if id == "" {
		return nil
	}
	if err := store.CheckApplianceID(id); err != nil {
		return badUsage("--appliance-id: %v", err)
	}
	return nil
}

// checkKeysFlag reads the public keys --keys names, a .pub file or a
// folder of them.
func checkKeysFlag(keys string) error {
	if keys == "" {
		return nil
	}
	if _, err := firmware.LoadKeyring(keys); err != nil {
		return badUsage("--keys: %v", err)
	}
	return nil
}

// checkNewAgent refuses an --agent that no run in the data folder dir
// could start with, when that is known without the store: while no bundle
// is installed there, new runs have the embedded reference bundle's agents
// and the bench workload's. With bundles installed, the run itself says.
func checkNewAgent(dir, agent string) error {
	if _, err := os.Stat(filepath.Join(dir, "firmware")); err == nil {
		return nil
	}
	ref, err := firmware.Reference()
	if err != nil {
		return err
	}
	workload, err := bench.ReferenceAgent()
	if err != nil {
		return err
	}
	names := append(ref.AgentNames(), workload.Name)
	if slices.Contains(names, agent) {
		return nil
	}
	return badUsage("--agent %q: no such agent (available: %s)", agent, strings.Join(names, ", "))
}

// givenAs is the name under which the command line set the flag name: an
// alias of it (serve's --uplink for uplink flush's --url) or name itself.
func givenAs(fs *cmdFlags, name string) string {
	for alias, of := range fs.aliases {
		if of == name && flagGiven(fs.FlagSet, alias) {
			return alias
		}
	}
	return name
}
