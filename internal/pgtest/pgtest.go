// Package pgtest gives tests a PostgreSQL to run against: DSN returns
// $OUTPOST_PG_DSN, or starts a throwaway server from the Debian packages
// once per test binary, which Stop ends (call it from TestMain).
package pgtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
)

// DSN returns a PostgreSQL to test against: $OUTPOST_PG_DSN, or a
// throwaway server started from the Debian packages. It skips, loudly, only
// when neither exists.
func DSN(t testing.TB) string {
	t.Helper()
	if dsn := os.Getenv("OUTPOST_PG_DSN"); dsn != "" {
		return dsn
	}
	once.Do(func() { once.dsn, once.err = boot() })
	if once.err != nil {
		msg := "\n" +
			"##########################################################################\n" +
			"## SKIPPING THE POSTGRESQL COLLECTOR TESTS: no PostgreSQL could be started\n" +
			"## (" + once.err.Error() + ")\n" +
			"## Install it (apt-get install -y postgresql) or set OUTPOST_PG_DSN.\n" +
			"##########################################################################"
		fmt.Fprintln(os.Stderr, msg)
		t.Skip(msg)
	}
	return once.dsn
}

var once struct {
	sync.Once
	dsn  string
	err  error
	stop func()
}

// Stop ends the server DSN started, if it started one.
func Stop() {
	if once.stop != nil {
		once.stop()
	}
}

// boot runs initdb and pg_ctl in a temporary folder, as the postgres user
// when running as root; the server lives until Stop.
func boot() (string, error) {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		return "", fmt.Errorf("initdb not found under /usr/lib/postgresql")
	}
	bin := filepath.Dir(bins[len(bins)-1])
	dir, err := os.MkdirTemp("", "outpost-pg-")
	if err != nil {
		return "", err
	}
	run := func(args ...string) *exec.Cmd { return exec.Command(args[0], args[1:]...) }
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return "", fmt.Errorf("running as root and there is no postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return "", err
		}
		run = func(args ...string) *exec.Cmd {
			return exec.Command("runuser", append([]string{"-u", "postgres", "--"}, args...)...)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	data := filepath.Join(dir, "data")
	if out, err := run(filepath.Join(bin, "initdb"), "-D", data, "-A", "trust", "-U", "postgres").CombinedOutput(); err != nil {
		return "", fmt.Errorf("initdb: %v: %s", err, out)
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", port, dir)
	if out, err := run(filepath.Join(bin, "pg_ctl"), "-D", data, "-o", opts, "-l", filepath.Join(dir, "log"), "-w", "start").CombinedOutput(); err != nil {
		return "", fmt.Errorf("pg_ctl start: %v: %s", err, out)
	}
	once.stop = func() {
		_ = run(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "stop").Run()
		os.RemoveAll(dir)
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port), nil
}
