package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/outpost-edge/outpost/engine"
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
// a port that is neither a number up to 65535 nor a service name, or a
// host written as an IPv4 address that is not one (999.1.1.1), which would
// otherwise be looked up as a name when serve starts.
func checkListenAddr(name, addr, example string) error {
	host, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = net.LookupPort("tcp", port)
	}
	if err == nil && host != "" && strings.Trim(host, "0123456789.") == "" && net.ParseIP(host) == nil {
		err = fmt.Errorf("%q is not an IP address", host)
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

// checkNewRun refuses what run's --thread, --agent and --tools ask for
// when a new run in the data folder dir could not start with it, as the
// run would refuse it, but before the store is opened or made: an empty
// thread, an agent that no bundle new runs use has, a tool outside the
// agent's registry. The bundles installed in dir are read for it (no store
// is opened); where they cannot be read, or none is installed and the
// folder does not say so yet, the run itself says what is wrong. The
// bundles are loaded for lb.rt (what lb holds loaded already is used as
// it is), and it returns what it loaded, for the run's session to run, so
// that they are not verified or compiled again.
func checkNewRun(dir, thread, agent string, tools *toolsFlag, lb loadedBundles) (loadedBundles, error) {
	if thread == "" {
		return lb, badUsage("--thread is empty: name the thread (conversation) to run the turn on, or leave --thread out for \"default\"")
	}
	var resolve engine.Resolver
	var err error
	if lb.ref == nil {
		if lb.ref, err = firmware.ReferenceWithRuntime(lb.rt); err != nil {
			return loadedBundles{rt: lb.rt}, nil
		}
	}
	if _, serr := os.Stat(filepath.Join(dir, "firmware")); serr != nil {
		resolve, err = referenceResolver(lb.ref) // nothing installed: the embedded bundle's agents and the bench's
	} else {
		if lb.in == nil {
			lb.in, err = openInstaller(dir, lb.rt)
		}
		if err == nil {
			resolve, err = applianceResolver(dir, lb, nil, true, keepPinning)
		}
	}
	if err != nil {
		return lb, nil
	}
	ag, err := resolve(agent, engine.BundleRef{})
	if errors.Is(err, engine.ErrUnknownAgent) {
		return lb, badUsage("--agent: %v", err)
	}
	if err != nil || !tools.set {
		return lb, nil
	}
	unknown, err := firmware.UnknownTools(ag, firmware.ParseToolList(tools.names))
	if err != nil || unknown == nil {
		return lb, nil
	}
	unknown.Agent = agent
	return lb, badUsage("--tools: %v", unknown)
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
