package console

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/outpost-edge/outpost/internal/fsync"
)

// TokenFile is the bearer token's file name in the data folder.
const TokenFile = "console.token"

// LoadOrCreateToken returns the console's bearer token from dir, making it
// (32 random bytes, hex) with mode 0600 at first start. created says
// whether it was made now. A token file that others can read is tightened
// to 0600 rather than trusted as is.
func LoadOrCreateToken(dir string) (token string, created bool, err error) {
	return LoadOrCreateTokenFile(dir, TokenFile)
}

// LoadOrCreateTokenFile is LoadOrCreateToken for a token file of another
// name in dir (the collector keeps its own, uplink.TokenFile).
func LoadOrCreateTokenFile(dir, name string) (token string, created bool, err error) {
	tok, err := ReadTokenFile(dir, name)
	if err == nil {
		return tok, false, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", false, err
	}
	if err := fsync.MkdirAll(dir, 0o700); err != nil {
		return "", false, fmt.Errorf("%w: %w", ErrTokenFile, err)
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", false, fmt.Errorf("%w: %w", ErrTokenFile, err)
	}
	tok = hex.EncodeToString(b[:])
	path := filepath.Join(dir, name)
	// O_EXCL: two processes starting at once must not both write a token.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		tok, err := ReadTokenFile(dir, name)
		return tok, false, err
	}
	if err != nil {
		return "", false, fmt.Errorf("%w: %w", ErrTokenFile, err)
	}
	werr := writeToken(f, tok)
	if werr == nil {
		// The token's name must survive a power cut as its bytes do, or
		// the next start makes another and the saved one stops working.
		werr = fsync.Dir(dir)
	}
	if werr != nil {
		os.Remove(path)
		return "", false, fmt.Errorf("%w: write %s: %w", ErrTokenFile, path, werr)
	}
	return tok, true, nil
}

// ReadToken reads the token made by LoadOrCreateToken. A missing file is
// reported with an error that wraps os.ErrNotExist.
func ReadToken(dir string) (string, error) {
	return ReadTokenFile(dir, TokenFile)
}

// ReadTokenFile is ReadToken for a token file of another name in dir.
func ReadTokenFile(dir, name string) (string, error) {
	path := filepath.Join(dir, name)
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrTokenFile, err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(path, 0o600); err != nil {
			return "", fmt.Errorf("%w: %s is readable by others and cannot be tightened: %w", ErrTokenFile, path, err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrTokenFile, err)
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) < 32 || strings.ContainsAny(tok, " \t\r\n") {
		return "", fmt.Errorf("%w: %s does not hold a token", ErrTokenFile, path)
	}
	return tok, nil
}

// tokenEqual compares in constant time. Hashing first makes the time
// independent of the lengths too.
func tokenEqual(got, want string) bool {
	a := sha256.Sum256([]byte(got))
	b := sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1 && want != ""
}

// ReplaceTokenFile writes tok into the token file name in dir, in place of
// the token it holds (mode 0600, as os.CreateTemp makes it): a collector whose store holds the token
// it shares with others keeps that one in its folder, where
// "outpost token --collector" reads it. The file is replaced whole, by a
// rename, so a crash leaves the old token or the new one.
func ReplaceTokenFile(dir, name, tok string) error {
	path := filepath.Join(dir, name)
	f, err := os.CreateTemp(dir, name+".new-*")
	if err != nil {
		return fmt.Errorf("%w: %w", ErrTokenFile, err)
	}
	werr := writeToken(f, tok)
	if werr == nil {
		werr = os.Rename(f.Name(), path)
	}
	if werr == nil {
		werr = fsync.Dir(dir)
	}
	if werr != nil {
		os.Remove(f.Name())
		return fmt.Errorf("%w: write %s: %w", ErrTokenFile, path, werr)
	}
	return nil
}

// writeToken writes tok to f, syncs and closes it.
func writeToken(f *os.File, tok string) error {
	_, err := f.WriteString(tok + "\n")
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
