package firmware

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Limits on what a bundle may hold, so that a hostile archive cannot
// exhaust memory.
const (
	maxFileSize   = 64 << 20
	maxBundleSize = 256 << 20
	maxFiles      = 10000
)

// contents is a bundle read into memory: path (slash-separated, relative)
// to bytes. Bundles are small (graphs, prompts, a knowledge base), and
// holding them in memory means a file cannot change between its hash check
// and its use.
type contents map[string][]byte

// readBundle reads a bundle directory or a .tar of one. Only the container
// is checked here (paths, file types, sizes); nothing inside is parsed.
func readBundle(p string) (contents, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, fmt.Errorf("read bundle: %w", err)
	}
	if fi.IsDir() {
		// The folder named may itself be a link (current -> v7): it is
		// resolved, and the links inside are refused, as always.
		root, err := filepath.EvalSymlinks(p)
		if err != nil {
			return nil, fmt.Errorf("read bundle: %w", err)
		}
		return readDir(root)
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("read bundle: %w", err)
	}
	defer f.Close()
	return readTar(f)
}

// readDir reads every file under root. Symlinks and special files are
// refused: a link could point outside the bundle, or change after the
// check.
func readDir(root string) (contents, error) {
	files := contents{}
	total := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return nil
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			return fmt.Errorf("%w: %s is a symbolic link", ErrPathEscape, rel)
		case d.IsDir():
			return nil
		case !d.Type().IsRegular():
			return fmt.Errorf("%w: %s is not a regular file", ErrPathEscape, rel)
		}
		if err := checkPath(rel); err != nil {
			return err
		}
		if len(files) >= maxFiles {
			return fmt.Errorf("%w: more than %d files", ErrMalformed, maxFiles)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.Size() > maxFileSize || total+int(info.Size()) > maxBundleSize {
			return fmt.Errorf("%w: %s: bundle too large", ErrMalformed, rel)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		total += len(data)
		files[rel] = data
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read bundle %s: %w", root, err)
	}
	return files, nil
}

// readTar reads a tar of a bundle. The tar may hold the bundle's files at
// its root or under a single top directory ("patterns/manifest.json").
// Links, devices and FIFOs are refused, as are paths that climb out.
func readTar(r io.Reader) (contents, error) {
	zr := &zeroTail{r: r}
	tr := tar.NewReader(zr)
	files := contents{}
	total := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			// A tar ends with two zeroed blocks. The reader takes a clean
			// end of input between entries as the end too, so a tar cut
			// at an entry's boundary would read as a bundle that lacks
			// its last files.
			if zr.zeros < 2*tarBlock {
				return nil, fmt.Errorf("read bundle tar: %w: it ends without the end-of-archive marker, after %d entries: cut short", ErrMalformed, len(files))
			}
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read bundle tar: %w: %v", ErrMalformed, err)
		}
		name := strings.TrimPrefix(h.Name, "./")
		switch h.Typeflag {
		case tar.TypeDir:
			if name != "" && name != "." {
				if err := checkPath(strings.TrimSuffix(name, "/")); err != nil {
					return nil, fmt.Errorf("read bundle tar: %w", err)
				}
			}
			continue
		case tar.TypeReg, tar.TypeRegA: //nolint:staticcheck // old archivers write TypeRegA
		case tar.TypeSymlink, tar.TypeLink:
			return nil, fmt.Errorf("read bundle tar: %w: %s is a link to %q", ErrPathEscape, h.Name, h.Linkname)
		default:
			return nil, fmt.Errorf("read bundle tar: %w: %s is not a regular file (type %q)", ErrPathEscape, h.Name, h.Typeflag)
		}
		if err := checkPath(name); err != nil {
			return nil, fmt.Errorf("read bundle tar: %w", err)
		}
		for k := range h.PAXRecords {
			// A sparse entry is mostly holes: a few bytes of archive
			// could claim the whole size limit in zeros.
			if strings.HasPrefix(k, "GNU.sparse.") {
				return nil, fmt.Errorf("read bundle tar: %w: %s is a sparse file", ErrMalformed, name)
			}
		}
		if _, dup := files[name]; dup {
			return nil, fmt.Errorf("read bundle tar: %w: %s appears twice", ErrMalformed, name)
		}
		if len(files) >= maxFiles {
			return nil, fmt.Errorf("read bundle tar: %w: more than %d files", ErrMalformed, maxFiles)
		}
		if h.Size < 0 || h.Size > maxFileSize || total+int(h.Size) > maxBundleSize {
			return nil, fmt.Errorf("read bundle tar: %w: %s: bundle too large", ErrMalformed, name)
		}
		var buf bytes.Buffer
		if _, err := io.CopyN(&buf, tr, h.Size); err != nil {
			return nil, fmt.Errorf("read bundle tar: %w: %s: %v", ErrMalformed, name, err)
		}
		total += buf.Len()
		files[name] = buf.Bytes()
	}
	return stripTop(files), nil
}

const tarBlock = 512

// zeroTail reads r, counting the zero bytes at the end of what it read.
type zeroTail struct {
	r     io.Reader
	zeros int
}

func (z *zeroTail) Read(p []byte) (int, error) {
	n, err := z.r.Read(p)
	read := p[:n]
	i := len(read)
	for i > 0 && read[i-1] == 0 {
		i--
	}
	if i == 0 {
		z.zeros += n
	} else {
		z.zeros = n - i
	}
	return n, err
}

// stripTop removes a single top directory shared by every file when the
// manifest lives there rather than at the root.
func stripTop(files contents) contents {
	if _, ok := files[ManifestFile]; ok || len(files) == 0 {
		return files
	}
	top := ""
	for p := range files {
		dir, _, ok := strings.Cut(p, "/")
		if !ok || (top != "" && dir != top) {
			return files
		}
		top = dir
	}
	if _, ok := files[top+"/"+ManifestFile]; !ok {
		return files
	}
	out := make(contents, len(files))
	for p, data := range files {
		out[strings.TrimPrefix(p, top+"/")] = data
	}
	return out
}

// WriteTar writes the bundle in dir as a tar with the files at its root,
// in a stable order, for shipping to an appliance.
func WriteTar(dir string, w io.Writer) error {
	files, err := readDir(dir)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	for _, p := range sortedKeys(files) {
		h := &tar.Header{Name: p, Mode: 0o644, Size: int64(len(files[p])), Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(files[p]); err != nil {
			return err
		}
	}
	return tw.Close()
}
