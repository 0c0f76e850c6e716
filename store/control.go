package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"go.etcd.io/bbolt"
)

// ControlSocket is the name of the unix socket, in the data folder, through
// which the process that owns a store serves the operations that must run
// while it holds the file lock: an online backup, a check, a prune. The
// socket is created with mode 0600, so only the folder's owner can use it.
const ControlSocket = "outpost.sock"

// ServeControl serves db's online operations on the control socket in dir
// until ctx ends. Call it from the process that owns the store.
func ServeControl(ctx context.Context, db *DB, dir string) error {
	path := filepath.Join(dir, ControlSocket)
	// A socket left by a killed owner is stale: we hold the lock now.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("control socket: %w", err)
	}
	var l net.Listener
	err := withSocketPath(dir, func(addr string) (err error) {
		l, err = net.Listen("unix", addr)
		return err
	})
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	// The socket is the folder's to remove (below), not the listener's:
	// its address may be a path through a descriptor closed by then.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return fmt.Errorf("control socket: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /backup", func(w http.ResponseWriter, r *http.Request) {
		// The status is gone with the first byte, so the length is sent
		// first: a short body is how the client learns of a later failure.
		// One before the copy starts (a store closing) is an error answer.
		started := false
		err := db.view(func(tx *bbolt.Tx) error {
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Content-Length", strconv.FormatInt(tx.Size(), 10))
			started = true
			_, err := tx.WriteTo(ctxWriter{r.Context(), w})
			return err
		})
		if err != nil && !started {
			writeControl(w, nil, fmt.Errorf("backup: %w", err))
		}
	})
	mux.HandleFunc("GET /check", func(w http.ResponseWriter, r *http.Request) {
		rep, err := db.Check(r.Context())
		writeControl(w, rep, err)
	})
	mux.HandleFunc("GET /ledger", func(w http.ResponseWriter, r *http.Request) {
		st, err := db.Ledger(r.Context())
		writeControl(w, st, err)
	})
	mux.HandleFunc("POST /prune", func(w http.ResponseWriter, r *http.Request) {
		d, err := time.ParseDuration(r.URL.Query().Get("older_than"))
		if err != nil {
			writeControl(w, nil, fmt.Errorf("older_than: %w", err))
			return
		}
		rep, err := db.Prune(r.Context(), d, time.Now())
		writeControl(w, rep, err)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	err = srv.Serve(l)
	// Removed before ServeControl returns, so a process that waits for it
	// and exits leaves no socket behind.
	_ = os.Remove(path)
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("control socket: %w", err)
	}
	return nil
}

func writeControl(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	_ = json.NewEncoder(w).Encode(v)
}

// Control is a client of the control socket of the process that owns a
// store.
type Control struct {
	dir string
	c   *http.Client
}

// DialControl returns a client for the store in dir, or an error when no
// process serves its control socket.
func DialControl(dir string) (*Control, error) {
	path := filepath.Join(dir, ControlSocket)
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("no control socket in %s: %w", dir, err)
	}
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (conn net.Conn, err error) {
			err = withSocketPath(dir, func(addr string) error {
				var d net.Dialer
				conn, err = d.DialContext(ctx, "unix", addr)
				return err
			})
			return conn, err
		},
	}}
	return &Control{dir: dir, c: c}, nil
}

// maxSocketPath is the longest path a unix socket address holds (sun_path
// is 108 bytes on Linux, 104 on the BSDs, with a terminating NUL).
const maxSocketPath = 103

// withSocketPath calls fn with an address for the control socket in dir.
// A data folder whose path is too long for a socket address is reached
// through a descriptor of the folder (/proc/self/fd/N/outpost.sock), open
// while fn runs; where that does not exist, the error says what is wrong.
func withSocketPath(dir string, fn func(addr string) error) error {
	path := filepath.Join(dir, ControlSocket)
	if len(path) <= maxSocketPath {
		return fn(path)
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	short := fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), ControlSocket)
	if _, err := os.Stat(filepath.Dir(short)); err != nil {
		return fmt.Errorf("the data folder's path is %d bytes, too long for a unix socket address (at most %d), "+
			"and there is no /proc/self/fd to reach it through: use a shorter data folder path", len(path), maxSocketPath)
	}
	return fn(short)
}

func (c *Control) do(ctx context.Context, method, path string, out any) error {
	resp, err := c.send(ctx, method, path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(out)
}

// send makes a request and returns the owner's answer when it is 200 OK,
// or the error it names.
func (c *Control) send(ctx context.Context, method, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://outpost"+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("control socket in %s: %w", c.dir, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		var e struct{ Error string }
		_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&e)
		if e.Error == "" {
			e.Error = "answered " + resp.Status
		}
		return nil, fmt.Errorf("store owner: %s", e.Error)
	}
	return resp, nil
}

// Check runs Check in the owning process.
func (c *Control) Check(ctx context.Context) (*CheckReport, error) {
	var rep CheckReport
	return &rep, c.do(ctx, http.MethodGet, "/check", &rep)
}

// Ledger reads the outcome ledger's state in the owning process.
func (c *Control) Ledger(ctx context.Context) (LedgerState, error) {
	var st LedgerState
	return st, c.do(ctx, http.MethodGet, "/ledger", &st)
}

// Prune runs Prune in the owning process.
func (c *Control) Prune(ctx context.Context, olderThan time.Duration) (*PruneReport, error) {
	var rep PruneReport
	return &rep, c.do(ctx, http.MethodPost, "/prune?older_than="+olderThan.String(), &rep)
}

// BackupFile writes a consistent copy of the store, taken by the owning
// process, to path (atomically: a partial copy never appears there).
func (c *Control) BackupFile(ctx context.Context, path string) error {
	resp, err := c.send(ctx, http.MethodGet, "/backup")
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer resp.Body.Close()
	// The length is how a copy cut short is told from a whole one.
	want := resp.ContentLength
	if want <= 0 {
		return fmt.Errorf("backup: the store owner sent no length")
	}
	copyProgressOf(ctx).start(want)
	return writeNewFile(path, func(f *os.File) error {
		n, err := io.Copy(ctxWriter{ctx, f}, resp.Body)
		if err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		if n != want {
			return fmt.Errorf("backup: got %d of %d bytes", n, want)
		}
		return nil
	})
}
