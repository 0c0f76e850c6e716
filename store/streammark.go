package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/outpost-edge/outpost/internal/fsync"
)

// The stream count a store file holds (NextStreamEpoch) goes with the file.
// But a console client knows the appliance, not the file: where another
// file takes the store's place (a salvaged copy, a restored backup), its
// count is the one it was made with, and two copies made from one file
// hold the same. Nothing in either tells it from the other: they come from
// the same bytes, and neither is written once made until it starts. Only
// the clock could set them apart, and the count, shifted 32 bits up under
// 2^53, has no room for a clock fine enough to part two copies started
// minutes apart. So each start also records its count in a file beside the
// store's place (streamMarkFile), which stays when the store file is moved
// aside and another moved in; the next start there, whatever file it
// opens, counts past it.

// streamMarkFile is the file beside the store file at path that holds the
// greatest stream count a start from that path gave out.
func streamMarkFile(path string) string { return path + ".stream" }

// readStreamMark returns the count the stream mark beside path holds, 0
// where there is none.
func readStreamMark(path string) (uint64, error) {
	name := streamMarkFile(path)
	b, err := os.ReadFile(name)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(strings.TrimSuffix(string(b), "\n"), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s holds %q, not the event stream's count: remove it to count on from the store file's own "+
			"count, which may number new events as a store served from here before did", name, b)
	}
	return n, nil
}

// writeStreamMark records count in the stream mark beside path, through a
// temporary file fsynced and renamed into place, so that the mark is
// whole or as it was. Only the store's writer calls it, under its lock.
func writeStreamMark(path string, count uint64) error {
	name := streamMarkFile(path)
	tmp := name + ".tmp"
	err := os.WriteFile(tmp, []byte(strconv.FormatUint(count, 10)+"\n"), 0o600)
	if err == nil {
		err = syncFile(tmp)
	}
	if err == nil {
		err = os.Rename(tmp, name)
	}
	if err == nil {
		err = fsync.Dir(filepath.Dir(name))
	}
	if err != nil {
		return fmt.Errorf("record the event stream's count in %s: %w", name, errors.Join(err, removeIfExists(tmp)))
	}
	return nil
}

// syncFile fsyncs the file at path.
func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	return errors.Join(f.Sync(), f.Close())
}
