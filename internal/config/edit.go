package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/pelletier/go-toml/v2/unstable"
)

// AddRules adds entries to the [network] allow or block list of the
// config file at path ("always" and "block" answers at the interactive
// gate write there). It creates the file, the [network] table or the list
// as needed and keeps everything else byte for byte: a person's comments,
// order and spacing are theirs. Entries already in the list are skipped;
// added says which were written.
//
// The edited document is parsed again before it replaces the file
// (atomically, with the file's mode), and must hold the new entries: a
// file this cannot edit safely (an inline network table, say) is left as
// it was and the error says what to add by hand.
func AddRules(path, list string, entries ...string) (added []string, err error) {
	if list != "allow" && list != "block" {
		return nil, fmt.Errorf("adding rules: list %q is neither allow nor block", list)
	}
	data, err := os.ReadFile(path)
	mode := fs.FileMode(0o644)
	var owner *syscall.Stat_t
	switch {
	case errors.Is(err, fs.ErrNotExist):
		data = nil
	case err != nil:
		return nil, fmt.Errorf("reading %s: %w", path, err)
	default:
		if st, err := os.Stat(path); err == nil {
			mode = st.Mode().Perm()
			owner, _ = st.Sys().(*syscall.Stat_t)
		}
	}
	f, err := Parse(path, data)
	if err != nil {
		return nil, fmt.Errorf("%w (fix the file, then answer again)", err)
	}
	have := f.Network.Allow
	if list == "block" {
		have = f.Network.Block
	}
	for _, e := range entries {
		if !slices.ContainsFunc(have, func(h string) bool { return strings.EqualFold(h, e) }) &&
			!slices.Contains(added, e) {
			added = append(added, e)
		}
	}
	if len(added) == 0 {
		return nil, nil
	}
	byHand := fmt.Errorf("%s: could not add %s to [network] %s safely; add it there by hand", path, quoteList(added), list)
	out, ok := insertRules(data, list, added)
	if !ok {
		return nil, byHand
	}
	g, err := Parse(path, out)
	if err != nil {
		return nil, byHand
	}
	got := g.Network.Allow
	if list == "block" {
		got = g.Network.Block
	}
	for _, e := range added {
		if !slices.Contains(got, e) {
			return nil, byHand
		}
	}
	if err := writeFileAtomic(path, out, mode, owner); err != nil {
		return nil, fmt.Errorf("writing %s: %w", path, err)
	}
	return added, nil
}

// insertRules returns data with entries added to network.<list>.
func insertRules(data []byte, list string, entries []string) ([]byte, bool) {
	ix := indexDoc(data)
	if !ix.ok {
		return nil, false
	}
	q := quoteList(entries)
	ins := func(off int, s string) []byte {
		out := make([]byte, 0, len(data)+len(s))
		out = append(out, data[:off]...)
		out = append(out, s...)
		return append(out, data[off:]...)
	}
	key := "network." + list
	if e, ok := ix.lookup(key); ok {
		if e.kind != unstable.Array {
			return nil, false
		}
		// After the last element, or right after "[" when there is none.
		last, n := entry{}, 0
		for ; ; n++ {
			el, ok := ix.lookup(key + "[" + strconv.Itoa(n) + "]")
			if !ok {
				break
			}
			last = el
		}
		if n == 0 {
			if e.val.off >= len(data) || data[e.val.off] != '[' {
				return nil, false
			}
			return ins(e.val.off+1, q), true
		}
		end, ok := stringEnd(data, last.val.off)
		if !ok {
			return nil, false
		}
		return ins(end, ", "+q), true
	}
	line := list + " = [" + q + "]\n"
	if e, ok := ix.lookup("network"); ok {
		if e.kind != unstable.Table {
			return nil, false // an inline table cannot take another key
		}
		// The line after the [network] header.
		i := bytes.IndexByte(data[e.key1.off:], '\n')
		if i < 0 {
			return append(append(slices.Clone(data), '\n'), line...), true
		}
		return ins(e.key1.off+i+1, line), true
	}
	for _, e := range ix.entries {
		if len(e.parts) > 1 && e.parts[0] == "network" {
			// Dotted keys at the top level (network.inspect = true): a
			// [network] header now would define the table twice, so the
			// list goes in as a dotted key too, on the line before.
			start := bytes.LastIndexByte(data[:e.key1.off], '\n') + 1
			return ins(start, "network."+line), true
		}
	}
	out := slices.Clone(data)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	if len(out) > 0 {
		out = append(out, '\n')
	}
	return append(out, "[network]\n"+line...), true
}

// stringEnd is the offset just past the TOML string starting at off.
func stringEnd(data []byte, off int) (int, bool) {
	if off >= len(data) {
		return 0, false
	}
	switch quote := data[off]; quote {
	case '\'':
		if i := bytes.IndexByte(data[off+1:], '\''); i >= 0 {
			return off + 1 + i + 1, true
		}
	case '"':
		for i := off + 1; i < len(data); i++ {
			switch data[i] {
			case '\\':
				i++
			case '"':
				return i + 1, true
			case '\n':
				return 0, false
			}
		}
	}
	return 0, false // multi-line strings and anything else: by hand
}

// quoteList writes entries as TOML basic strings separated by commas.
// Rule entries are printable ASCII without quotes or backslashes (the
// policy parser refuses anything else), so Go's quoting is TOML's.
func quoteList(entries []string) string {
	q := make([]string, len(entries))
	for i, e := range entries {
		q[i] = strconv.Quote(e)
	}
	return strings.Join(q, ", ")
}

// writeFileAtomic replaces path with data, keeping the old file's mode and
// owner (a daemon running as root edits a user's file as that user's).
func writeFileAtomic(path string, data []byte, mode fs.FileMode, owner *syscall.Stat_t) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if owner != nil {
		if err := tmp.Chown(int(owner.Uid), int(owner.Gid)); err != nil && !errors.Is(err, fs.ErrPermission) {
			tmp.Close()
			return err
		}
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
