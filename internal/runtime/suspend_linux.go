package runtime

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/statefs"
)

// Suspend and resume: the guest, its memory and its open files, saved
// with `runsc checkpoint` and brought back with `runsc restore`.
//
// The daemon asks for a checkpoint on the shim's socket (ShimSuspend,
// after ShimGo), and the shim answers there: runsc's state and the
// guest's namespaces are the shim's, so only it can run runsc for them.
// The image is written beside the final one and renamed into place only
// once runsc has written all of it, so an image in SuspendDir is whole:
// a failed or killed checkpoint leaves none that could be taken for one.

// ShimSuspend is the daemon's word, once the guest runs, to checkpoint
// it into SuspendDir. runsc stops the guest once it is saved; the shim
// then waits, as for a stop, for the daemon's SIGTERM.
const ShimSuspend = 's'

// The shim's answers to ShimSuspend: ShimSuspended, or an error's text
// after "error: ".
const ShimSuspended = "ok"

// SuspendDir holds a suspended sandbox's checkpoint image. On disk:
// frozen.
func SuspendDir(stateDir string) string { return filepath.Join(stateDir, "suspend") }

// suspendTemp is where a checkpoint is written before it is whole.
func suspendTemp(stateDir string) string { return filepath.Join(stateDir, "suspend.new") }

// checkpointState is the one file every runsc image has (gVisor's
// checkpointfiles.StateFileName); the others (pages) are optional.
const checkpointState = "checkpoint.img"

// ImageSize is the size in bytes of the sandbox's checkpoint image, and
// whether it has one.
func ImageSize(stateDir string) (int64, bool) {
	dir := SuspendDir(stateDir)
	if _, err := os.Stat(filepath.Join(dir, checkpointState)); err != nil {
		return 0, false
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, false
	}
	var n int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n, true
}

// RemoveImage deletes the sandbox's checkpoint image and any half-written
// one.
func RemoveImage(stateDir string) error {
	os.RemoveAll(suspendTemp(stateDir))
	return os.RemoveAll(SuspendDir(stateDir))
}

// RemoveSaved deletes everything a suspend kept: the image and the
// guest's binary, which a guest booted afresh no longer maps; and a
// fork's parent keys, which only its restored guest knows.
func RemoveSaved(stateDir string) error {
	os.Remove(GuestBinary(stateDir))
	os.RemoveAll(ForkKeysDir(stateDir))
	return RemoveImage(stateDir)
}

// restoreArgs are runsc's arguments that bring the guest back from
// p.Restore, detached like `runsc run --detach`. With --background runsc
// returns once the guest runs, while the sentry may still read pages from
// the image's files, which it holds open: deleting the image then
// (restored) does not cut that short.
func restoreArgs(p *Plan, pidFile, bundle string) []string {
	return []string{"restore", "--detach", "--background", "--image-path=" + p.Restore, "--pid-file=" + pidFile, "--bundle=" + bundle, p.ID}
}

// createSandbox has runsc create the sandbox of a standby's restore
// (Plan.Standby): its gofer and sentry start and wait, running no guest
// code until `runsc restore` of the same container, which then skips the
// create.
//
// Not through p.runsc, which collects runsc's stderr through a pipe: the
// sentry and the gofer runsc create leaves behind inherit it, and the
// pipe would never end.
func (p *Plan) createSandbox(bundle string) error {
	create := exec.Command(p.Runsc, append(p.runscArgs(p.Debug), "create", "--pid-file="+sandboxPidFile(bundle), "--bundle="+bundle, p.ID)...)
	create.Stdout, create.Stderr, create.Env = os.Stdout, os.Stderr, runscEnv
	if err := create.Run(); err != nil {
		return fmt.Errorf("runsc create: %w", err)
	}
	return nil
}

// restored deletes the image the guest came back from. Once the guest
// runs its files change, and the image's memory no longer matches them:
// restoring it a second time would give the guest's processes a
// filesystem that moved under them. The image is kept only until the
// next suspend makes a new one.
func restored(p *Plan, took time.Duration) {
	fmt.Fprintf(os.Stderr, "moat shim: guest restored in %d ms\n", took.Milliseconds())
	if err := RemoveImage(p.StateDir); err != nil {
		fmt.Fprintf(os.Stderr, "moat shim: removing the restored image: %v\n", err)
	}
	// The daemon read them before it had the guest started.
	os.RemoveAll(ForkKeysDir(p.StateDir))
}

// ForkKeysDir holds, in a sandbox made by moat fork and until its first
// restore, its parent's client key and the agent's public host key: the
// restored guest knows only those until it takes the fork's own
// (daemon/fork.go). On disk: frozen.
func ForkKeysDir(stateDir string) string { return filepath.Join(stateDir, "fork-keys") }

// restoreFailed drops an image runsc could not restore (a corrupt one,
// one of another gVisor, a configuration changed since the suspend) so
// that the next start boots afresh instead of failing the same way; the
// writable layer is untouched.
func restoreFailed(p *Plan, err error) error {
	RemoveSaved(p.StateDir)
	return fmt.Errorf("restoring the suspended guest: runsc restore: %v; its saved processes are dropped, and the next start boots it afresh with its files", err)
}

// readWords delivers the daemon's words on ShimFD, one byte each, until
// it closes its end.
func readWords() <-chan byte {
	words := make(chan byte)
	go func() {
		defer close(words)
		b := make([]byte, 16)
		for {
			n, err := unix.Read(ShimFD, b)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if n < 1 || err != nil {
				return
			}
			words <- b[0]
		}
	}()
	return words
}

// answerWord acts on one of the daemon's words and answers it; it
// reports whether the guest has been checkpointed (and is stopping).
func answerWord(p *Plan, w byte, env []string) bool {
	if w != ShimSuspend {
		unix.Write(ShimFD, []byte(fmt.Sprintf("error: unknown word %q", w)))
		return false
	}
	err := p.checkpoint(env)
	answer := ShimSuspended
	if err != nil {
		answer = "error: " + err.Error()
	}
	unix.Write(ShimFD, []byte(answer))
	return err == nil
}

// GuestBinary is the copy of moat's binary a suspended guest was saved
// with, which its restore mounts at /.moat/moat in place of Plan.Moat.
// The guest's init and agent run from that file and their code pages are
// read from it again after a restore (gVisor checks no file for change):
// a moat upgraded between suspend and resume would otherwise hand the
// restored processes another binary's code, and they crash. On disk:
// frozen.
func GuestBinary(stateDir string) string { return filepath.Join(stateDir, "guest-moat") }

// moatAtStart is the identity of Plan.Moat when the shim started, which
// the guest maps; a checkpoint refuses a binary replaced since.
var moatAtStart os.FileInfo

// noteGuestBinary records the identity of the binary the guest will map.
func (p *Plan) noteGuestBinary() { moatAtStart, _ = os.Stat(p.Moat) }

// keepGuestBinary makes GuestBinary the file the guest maps: a hard link
// to it when it is on the state's filesystem (the same inode, whatever
// later replaces the path), else a copy.
func (p *Plan) keepGuestBinary() error {
	dst := GuestBinary(p.StateDir)
	if p.Moat == dst {
		return nil // a resumed guest's: kept already
	}
	now, err := os.Stat(p.Moat)
	if err != nil || moatAtStart == nil || !os.SameFile(now, moatAtStart) ||
		now.Size() != moatAtStart.Size() || !now.ModTime().Equal(moatAtStart.ModTime()) {
		return fmt.Errorf("%s changed since this sandbox started, and the guest runs the old one, which cannot be saved; restart the sandbox (moat down, then moat up) and suspend it again", p.Moat)
	}
	tmp := dst + ".new"
	os.Remove(tmp)
	if err := os.Link(p.Moat, tmp); err != nil {
		if err := copyFile(p.Moat, tmp, 0o755); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("keeping the guest's moat binary: %w", err)
		}
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("keeping the guest's moat binary: %w", err)
	}
	return nil
}

// checkpoint saves the guest with `runsc checkpoint` into suspendTemp,
// readable by root only, moves it to SuspendDir once it is whole and on
// disk, and only then ends the guest.
//
// The guest is paused first (`runsc pause`) and saved with
// --leave-running, which resumes only the save's own pause: without it
// runsc kills the guest after the save whether or not the save worked,
// so a full disk would have cost the user their processes. Paused, the
// guest cannot change its files after the save; a save that fails is
// undone with `runsc resume`, and one that succeeds ends with every
// process of the shim's PID namespace killed.
func (p *Plan) checkpoint(env []string) error {
	if err := p.keepGuestBinary(); err != nil {
		return err
	}
	if _, err := p.runsc(env, "pause", p.ID); err != nil {
		return err
	}
	if err := p.saveImage(env); err != nil {
		if _, rerr := p.runsc(env, "resume", p.ID); rerr != nil {
			return fmt.Errorf("%v; resuming the paused guest failed too: %v", err, rerr)
		}
		return err
	}
	// The guest is saved and paused: its sandbox and gofer go now; the
	// shim reaps them and waits for the daemon's stop.
	unix.Kill(-1, unix.SIGKILL)
	return nil
}

// saveImage writes the paused guest's image into SuspendDir.
func (p *Plan) saveImage(env []string) error {
	tmp := suspendTemp(p.StateDir)
	os.RemoveAll(tmp)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", tmp, err)
	}
	// runsc creates the image's files 0644; the directory keeps others
	// out, and the umask and the chmod below make the files 0600 too:
	// the image holds the guest's memory, its keys and tokens included.
	old := unix.Umask(0o077)
	_, err := p.runsc(env, "checkpoint", "--leave-running", "--image-path="+tmp, p.ID)
	unix.Umask(old)
	if err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := syncImage(tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if p.Rootless {
		if err := giveToStateOwner(p.StateDir, tmp); err != nil {
			os.RemoveAll(tmp)
			return err
		}
	}
	dst := SuspendDir(p.StateDir)
	os.RemoveAll(dst)
	if err := os.Rename(tmp, dst); err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("moving the image into place: %w", err)
	}
	return statefs.SyncPath(p.StateDir)
}

// runsc runs one runsc command for this sandbox; its output goes to the
// shim's (runsc.log), its last line into the error.
func (p *Plan) runsc(env []string, args ...string) (string, error) {
	cmd := exec.Command(p.Runsc, append(p.runscArgs(p.Debug), args...)...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr, cmd.Env = os.Stdout, &out, env
	err := cmd.Run()
	if out.Len() > 0 {
		os.Stderr.WriteString(out.String())
	}
	if err != nil {
		return out.String(), fmt.Errorf("runsc %s: %v: %s", args[0], err, lastLine(out.String()))
	}
	return out.String(), nil
}

// syncImage makes the image's files 0600 and flushes them to disk: runsc
// does not, and a host that crashed before the page cache is written
// would otherwise leave a renamed image of zeroes.
func syncImage(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("reading the image: %w", err)
	}
	for _, e := range ents {
		f, err := os.OpenFile(filepath.Join(dir, e.Name()), os.O_RDONLY, 0)
		if err != nil {
			return fmt.Errorf("flushing the image: %w", err)
		}
		err = f.Chmod(0o600)
		if err == nil {
			err = f.Sync()
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("flushing the image: %w", err)
		}
	}
	return statefs.SyncPath(dir)
}

// giveToStateOwner gives the image in dir, and the guest binary kept
// beside it when the shim copied it, to the owner of the state dir.
// Rootless, what runsc writes belongs to root of the shim's user
// namespace, a subordinate id on the host, and the daemon, which runs as
// the user, must write the image's manifest, read its files to copy them
// (fork, snapshots) and remove it. The user's own id is mapped in the
// namespace (userns.KeepIDs), so the namespace's root may give it files.
func giveToStateOwner(stateDir, dir string) error {
	var st unix.Stat_t
	if err := unix.Stat(stateDir, &st); err != nil {
		return err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	paths := []string{dir, GuestBinary(stateDir)}
	for _, e := range ents {
		paths = append(paths, filepath.Join(dir, e.Name()))
	}
	for _, path := range paths {
		// Only what the namespace's root made: the guest binary may be
		// a hard link to moat's own, which is not the namespace's to give.
		var fst unix.Stat_t
		if err := unix.Lstat(path, &fst); err != nil || fst.Uid != 0 {
			continue
		}
		if err := os.Lchown(path, int(st.Uid), int(st.Gid)); err != nil {
			return fmt.Errorf("giving the image to the state dir's owner: %w", err)
		}
	}
	return nil
}

// lastLine is the line of runsc's output that says why it failed: the
// last that says "failed" (runsc may print goroutine stacks after it),
// else the last.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "failed") {
			return strings.TrimSpace(lines[i])
		}
	}
	return strings.TrimSpace(lines[len(lines)-1])
}

// waitRelease waits, once the guest has been checkpointed and has
// exited, for the daemon to end the shim: a SIGTERM, or its end of the
// socket closing.
func waitRelease(sigs <-chan os.Signal, words <-chan byte) {
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGTERM || sig == syscall.SIGINT {
				return
			}
		case _, ok := <-words:
			if !ok {
				return
			}
		}
	}
}
