package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"moat.dev/moat/internal/userns"
)

// A store without root (moat without sudo) lives under the user's own MOAT_HOME, and its layers
// must look to the guest as they look to a root moat's guest: a file the image gives uid 1000 is
// uid 1000's in the guest, /usr is root's. The sandbox runs in a user namespace with the KeepIDs
// layout (internal/userns): the user's uid is itself, every other id from 0 up is the user's
// subordinate range. So each layer is unpacked by a child that is root of a namespace with that
// same map: its chown to the image's ids lands each file on the subordinate id the sandbox will
// see as that id, and nothing but the kernel's own mapping decides which host id a file gets.
//
// Rejected: unpacking as the user and recording the owners to apply later (every file would be
// the user's until then, and the record a second truth to keep in step); flattening the layers
// into one directory per image so no whiteout is needed (it gives up sharing layers between
// images, which is the point of the store). Whiteouts stay as overlayfs has them: the 0/0
// character device, which the kernel lets anyone make, and for opaque directories
// user.overlay.opaque, which overlayfs reads when mounted with userxattr, as the rootless shim
// mounts every overlay.
//
// What that child leaves belongs to subordinate ids, which the user can neither rename nor
// remove: the child also renames the finished layer into place, and removing a layer (moat
// image rm) runs in such a child too. The files the store keeps for itself (records, layer info,
// locks) stay the user's.

// Role is the hidden first argument with which a store without root re-executes moat as root of
// a user namespace (`moat __image-userns unpack ROOT HEX` with the layer tar on stdin, or
// `moat __image-userns rm ROOT PATH`); moat's main hands it to RoleMain.
const Role = "__image-userns"

// exitUnsafe is the child's exit code for ErrUnsafeArchive, so the parent can wrap it again.
const exitUnsafe = 3

// OpenRootless opens the store at root for a user without root: it must be the user's own, and
// layers are unpacked and removed by exe (moat) re-executed with Role in a user namespace.
func OpenRootless(root, exe string) (*Store, error) {
	s, err := open(root, func(abs string, fi os.FileInfo) error {
		st, ok := fi.Sys().(*syscall.Stat_t)
		if ok && int(st.Uid) != os.Geteuid() {
			return fmt.Errorf("image store %s belongs to uid %d, not to you (uid %d): moat without sudo keeps a store of its own, and one made with sudo is for sudo; set MOAT_HOME to a directory of yours", abs, st.Uid, os.Geteuid())
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.ns = &namespace{exe: exe}
	return s, nil
}

// namespace runs the store's work that needs root of a user namespace.
type namespace struct {
	exe string
}

// unpack unpacks the layer tar r, whose sha256 must be h, into the store at root, in a child.
func (n *namespace) unpack(ctx context.Context, root, h string, r io.Reader) (int64, error) {
	out, err := n.run(ctx, r, "unpack", root, h)
	if err != nil {
		return 0, err
	}
	size, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("unpacking in a user namespace: the child printed %q, not a size", out)
	}
	return size, nil
}

// run runs exe Role args... as root of a user namespace with the sandbox's map, stdin from r, and
// returns its stdout.
func (n *namespace) run(ctx context.Context, r io.Reader, args ...string) (string, error) {
	cfg, err := userns.Current(userns.KeepIDs)
	if err != nil {
		return "", fmt.Errorf("%s of the image store needs a user namespace: %w", args[0], err)
	}
	cmd := exec.CommandContext(ctx, n.exe, append([]string{Role}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r, &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// The copy into the child's stdin may be blocked reading a stalled download after the child
	// was killed; Wait stops waiting for it after this.
	cmd.WaitDelay = time.Second
	if err := cfg.Start(cmd); err != nil {
		return "", err
	}
	err = cmd.Wait()
	msg := strings.TrimSpace(stderr.String())
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), nil
	case errors.As(err, &ee) && ee.ExitCode() == exitUnsafe:
		return "", fmt.Errorf("%s: %w", strings.TrimSuffix(msg, ": "+ErrUnsafeArchive.Error()), ErrUnsafeArchive)
	case ctx.Err() != nil:
		return "", ctx.Err()
	case msg != "":
		return "", errors.New(msg)
	default:
		return "", fmt.Errorf("%s in a user namespace: %w", args[0], err)
	}
}

// removeAll is os.RemoveAll, retried in a user namespace for what belongs to subordinate ids.
func (s *Store) removeAll(path string) error {
	err := os.RemoveAll(path)
	if err == nil || s.ns == nil {
		return err
	}
	if _, nerr := s.ns.run(context.Background(), nil, "rm", s.root, path); nerr != nil {
		return fmt.Errorf("%v; in a user namespace: %w", err, nerr)
	}
	return nil
}

// giveToOwner hands a file the child made for the store itself (a layer's info) to the store's
// owner, so the user can read it; a no-op outside that child.
func (s *Store) giveToOwner(path string) error {
	if s.opaque != overlayUserOpaqueXattr {
		return nil
	}
	fi, err := os.Stat(s.root)
	if err != nil {
		return err
	}
	st := fi.Sys().(*syscall.Stat_t)
	if err := os.Lchown(path, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("giving %s to the store's owner: %w", path, err)
	}
	return nil
}

// RoleMain is the child's main (args after Role). It returns the exit code.
func RoleMain(args []string) int {
	if err := userns.Wait(syscall.SIGKILL); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	err := roleMain(args)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrUnsafeArchive):
		fmt.Fprintln(os.Stderr, err)
		return exitUnsafe
	default:
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
}

func roleMain(args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("usage: moat %s unpack ROOT HEX | rm ROOT PATH", Role)
	}
	root := filepath.Clean(args[1])
	if !filepath.IsAbs(root) {
		return fmt.Errorf("image store %q is not an absolute path", args[1])
	}
	switch args[0] {
	case "unpack":
		h := args[2]
		if len(h) != 64 || !isHex(h) || strings.ToLower(h) != h {
			return fmt.Errorf("bad layer digest %q", h)
		}
		s, err := open(root, nil)
		if err != nil {
			return err
		}
		s.opaque = overlayUserOpaqueXattr
		size, err := s.unpackStream(context.Background(), os.Stdin, h)
		if err != nil {
			return fmt.Errorf("unpacking layer sha256:%s: %w", h, err)
		}
		fmt.Println(size)
		return nil
	case "rm":
		// Root of the namespace may remove anything of the user's: only what the store holds.
		rel, err := filepath.Rel(root, filepath.Clean(args[2]))
		top, _, _ := strings.Cut(rel, string(filepath.Separator))
		if err != nil || !filepath.IsAbs(args[2]) || (top != "layers" && top != "locks" && top != "tmp") || rel == top {
			return fmt.Errorf("refusing to remove %s: not a layer or temp file of the image store %s", args[2], root)
		}
		return os.RemoveAll(filepath.Join(root, rel))
	default:
		return fmt.Errorf("unknown %s verb %q", Role, args[0])
	}
}
