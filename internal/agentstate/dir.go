package agentstate

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
)

// maxFileBytes bounds one versioned file (a guest decides how much it
// writes): 256 MiB is far past any conversation seen; a larger file is
// left out and said so.
const maxFileBytes = 256 << 20

// unsafeName says why a path may not be versioned, or "". Git's own names
// are refused wherever they appear (an in-tree .gitattributes is read by
// some gits in bare repositories); quotes, backslashes and control
// characters would need quoting in fast-import's stream.
func unsafeName(p string) string {
	for _, c := range strings.Split(p, "/") {
		switch c {
		case "", ".", "..", ".git", ".gitattributes", ".gitmodules", ".gitignore":
			return "a name git reserves"
		}
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f || r == '"' || r == '\\' {
			return "a control character, quote or backslash in its name"
		}
	}
	return ""
}

// scan reads the versioned files of a sandbox's directory: the agents'
// kept paths, regular files only. It goes through an os.Root, so a
// symbolic link the guest made that leads out of the directory is not
// followed: the host never reads its own files into a guest's history.
func scan(dir string, note func(string)) ([]file, error) {
	root, err := os.OpenRoot(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", dir, err)
	}
	defer root.Close()
	var out []file
	for _, a := range Agents {
		for _, keep := range a.Keep {
			top := a.Name + "/" + strings.TrimSuffix(keep, "/")
			err := fs.WalkDir(root.FS(), top, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					if p != top {
						note(fmt.Sprintf("%s: %v; left out", p, err))
					}
					return nil
				}
				if why := unsafeName(p); why != "" {
					note(fmt.Sprintf("%s: %s; left out", p, why))
					if d.IsDir() {
						return fs.SkipDir
					}
					return nil
				}
				if d.IsDir() || !d.Type().IsRegular() {
					return nil
				}
				b, err := readRegular(root, p)
				if err != nil {
					note(fmt.Sprintf("%s: %v; left out", p, err))
					return nil
				}
				out = append(out, file{path: p, sha: blobSHA(b), content: b})
				return nil
			})
			if err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// readRegular reads p if it is a regular file of at most maxFileBytes.
// O_NONBLOCK: a FIFO put in its place must not hang the host.
func readRegular(root *os.Root, p string) ([]byte, error) {
	f, err := root.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	if st.Size() > maxFileBytes {
		return nil, fmt.Errorf("%d bytes, past the limit of %d", st.Size(), maxFileBytes)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxFileBytes {
		return nil, fmt.Errorf("past the limit of %d bytes", maxFileBytes)
	}
	return b, nil
}

// batchBytes bounds the blobs a checkout holds in memory at once.
var batchBytes int64 = 64 << 20 // a variable for the tests

// writeTree makes dir's versioned files those of want, given that they
// were those of had: files of had not in want are removed, files whose
// blob changed are written (their content read through fetch, in
// batches of about batchBytes), each owned by uid:gid. Like scan, it
// goes through an os.Root: a link the guest left cannot make the host
// write outside the directory.
func writeTree(dir string, had, want map[string]entry, fetch func([]string) (map[string][]byte, error), uid, gid int) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("opening %s: %w", dir, err)
	}
	defer root.Close()
	var errs []error
	for p := range had {
		if _, ok := want[p]; !ok {
			if err := root.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	var changed []string
	for p, e := range want {
		if h, ok := had[p]; !ok || h.sha != e.sha {
			changed = append(changed, p)
		}
	}
	slices.Sort(changed)
	for len(changed) > 0 {
		n, size := 0, int64(0)
		for n < len(changed) && (n == 0 || size+want[changed[n]].size <= batchBytes) {
			size += want[changed[n]].size
			n++
		}
		batch := changed[:n]
		changed = changed[n:]
		var shas []string
		for _, p := range batch {
			shas = append(shas, want[p].sha)
		}
		slices.Sort(shas)
		blobs, err := fetch(slices.Compact(shas))
		if err != nil {
			return err
		}
		for _, p := range batch {
			b, ok := blobs[want[p].sha]
			if !ok {
				errs = append(errs, fmt.Errorf("%s: blob %s missing", p, want[p].sha))
				continue
			}
			if err := writeFile(root, p, b, uid, gid); err != nil {
				errs = append(errs, fmt.Errorf("writing %s: %w", p, err))
			}
		}
	}
	return errors.Join(errs...)
}

// writeFile writes p atomically (a temporary file renamed over it),
// making its parents, all owned by uid:gid.
func writeFile(root *os.Root, p string, b []byte, uid, gid int) error {
	if err := mkdirs(root, path.Dir(p), uid, gid); err != nil {
		return err
	}
	tmp := path.Join(path.Dir(p), ".moat-"+path.Base(p)+".tmp")
	root.RemoveAll(tmp)
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.Write(b)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		root.Remove(tmp)
		return err
	}
	if err := root.Lchown(tmp, uid, gid); err != nil {
		root.Remove(tmp)
		return err
	}
	if err := root.Rename(tmp, p); err != nil {
		// A directory the guest put where a file goes: the file wins.
		root.RemoveAll(p)
		if err := root.Rename(tmp, p); err != nil {
			root.Remove(tmp)
			return err
		}
	}
	return nil
}

// mkdirs makes d and its parents inside root, owned by uid:gid.
func mkdirs(root *os.Root, d string, uid, gid int) error {
	if d == "." || d == "" {
		return nil
	}
	if err := mkdirs(root, path.Dir(d), uid, gid); err != nil {
		return err
	}
	err := root.Mkdir(d, 0o700)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return root.Lchown(d, uid, gid)
}
