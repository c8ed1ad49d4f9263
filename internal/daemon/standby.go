package daemon

import (
	"bufio"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"moat.dev/moat/internal/state"
)

// A standby (docs/suspend.md): `moat suspend --standby` starts, right
// after the suspend, the daemon the next resume would start, and that
// daemon stops short of the guest. Its gate process is set up and locked
// down, its shim has mounted the root filesystem, made tap0 and created
// runsc's sandbox (the sentry waits, running no guest code), and the
// keeper waits on StandbySocket. A resume then only says "go": the shim
// restores the guest into the sandbox it created. Until then the sandbox
// is suspended to every reader: the standby holds state.StandbyLock, not
// the daemon lock, and writes nothing to the record.
//
// A standby is started with the environment and the secrets of the
// moment of the suspend, so "go" carries those a start would have now,
// and a standby that differs in any of them is stale: it says so and
// exits, and the caller starts a daemon the usual way. So does a standby
// whose record changed (a network rule, a forward, --reconfigure) or
// whose file: and command: secrets read differently now.

// StandbyEnv, set to 1 in the keeper's environment, makes it a standby.
const StandbyEnv = "MOAT_STANDBY"

// StandbySocket is where a standby keeper waits for its word.
func StandbySocket(dir string) string { return filepath.Join(dir, "standby.sock") }

// daemonPIDFile is the file, in the state dir, with the daemon's pid.
const daemonPIDFile = "daemon.pid"

// standbyPID is the file with a standby keeper's pid, for a dismissal
// whose word is not answered.
func standbyPID(dir string) string { return filepath.Join(dir, "standby.pid") }

// standbyRequest is the word to a standby. Env and Values, for "go", are
// what a start would give the daemon now: its environment (the variables
// of one start only dropped, standbyEnvKey) and the handover's values.
type standbyRequest struct {
	Op     string            `json:"op"` // "go" | "stop"
	Env    []string          `json:"env,omitempty"`
	Values map[string]string `json:"values,omitempty"`
}

// StaleError is a standby's answer when it is not what a start would be
// now: it has exited, and the caller starts the sandbox the usual way.
type StaleError struct{ Why string }

func (e *StaleError) Error() string { return "the standby is out of date: " + e.Why }

// ErrNoStandby: the sandbox has no standby.
var ErrNoStandby = errors.New("no standby")

// standbyEnvKey is env as a standby compares it: a variable given twice
// has its last value (as exec gives it), and those that differ between
// any two starts (the pipes' numbers, the role itself) are left out;
// sorted.
func standbyEnvKey(env []string) []string {
	last := map[string]string{}
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "MOAT_READY_FD", SecretsFDEnv, StandbyEnv:
			continue
		}
		last[k] = kv
	}
	out := slices.Collect(maps.Values(last))
	slices.Sort(out)
	return out
}

// changedVars are the names of the variables a and b do not have alike.
func changedVars(a, b []string) []string {
	was := map[string]string{}
	for _, kv := range a {
		k, v, _ := strings.Cut(kv, "=")
		was[k] = v
	}
	var out []string
	for _, kv := range b {
		k, v, _ := strings.Cut(kv, "=")
		if w, ok := was[k]; !ok || w != v {
			out = append(out, k)
		}
		delete(was, k)
	}
	for k := range was {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// resumeView is the record as it bears on a resume: what only says how
// the last run went is left out.
func resumeView(r *state.Record) ([]byte, error) {
	v := *r
	v.Desired, v.State, v.StopReason, v.Error, v.Hook = "", "", "", "", ""
	v.Started, v.Stopped, v.DaemonPID = time.Time{}, time.Time{}, 0
	v.GuestOOMKills, v.LastOOMKill = 0, ""
	return json.Marshal(&v)
}

// standbyState is what a standby keeper compares a "go" against. No
// secret is kept: values are kept as HMACs under a key that never leaves
// this process.
type standbyState struct {
	key    []byte
	env    []string
	values []byte
	record []byte

	mu      sync.Mutex
	secrets map[string][]byte // file: and command: sources read for the gate process
}

func newStandbyState(env []string, values map[string]string, rec *state.Record) (*standbyState, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	view, err := resumeView(rec)
	if err != nil {
		return nil, err
	}
	s := &standbyState{key: key, env: standbyEnvKey(env), record: view, secrets: map[string][]byte{}}
	s.values = s.mac(handoverBytes(values))
	return s, nil
}

func handoverBytes(values map[string]string) []byte {
	if len(values) == 0 {
		return nil // none, whether handed over as {} or not at all
	}
	b, _ := json.Marshal(values) // map keys sorted
	return b
}

func (s *standbyState) mac(b []byte) []byte {
	h := hmac.New(sha256.New, s.key)
	h.Write(b)
	return h.Sum(nil)
}

// readSecret notes what a file: or command: source gave the gate process.
func (s *standbyState) readSecret(name string, v []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.secrets[name] = s.mac(v)
}

// stale says why the standby is not what a start would be now, or "".
// read reads a secret's source again.
func (s *standbyState) stale(ctx context.Context, req standbyRequest, rec *state.Record, read func(context.Context, string) ([]byte, error)) string {
	if vs := changedVars(s.env, standbyEnvKey(req.Env)); len(vs) > 0 {
		return "its environment differs in " + strings.Join(vs, ", ")
	}
	if !hmac.Equal(s.values, s.mac(handoverBytes(req.Values))) {
		return "a secret's or an [env] entry's variable changed"
	}
	view, err := resumeView(rec)
	if err != nil || string(view) != string(s.record) {
		return "the sandbox's configuration, rules or forwards changed"
	}
	s.mu.Lock()
	names := maps.Clone(s.secrets)
	s.mu.Unlock()
	for name, was := range names {
		v, err := read(ctx, name)
		if err != nil {
			return fmt.Sprintf("secret %s could not be read again (%v)", name, err)
		}
		if !hmac.Equal(was, s.mac(v)) {
			return fmt.Sprintf("secret %s reads differently now", name)
		}
	}
	return ""
}

// standbyWord is one word to a standby keeper, with its connection for
// the answer.
type standbyWord struct {
	req  standbyRequest
	conn net.Conn
}

func (w standbyWord) answer(line string) {
	w.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintln(w.conn, line)
	w.conn.SetWriteDeadline(time.Time{})
}

// finish answers the word's last line and closes its connection.
func (w standbyWord) finish(line string) {
	w.answer(line)
	w.conn.Close()
}

// listenStandby listens on StandbySocket and hands each word to words.
func (d *daemon) listenStandby(words chan<- standbyWord) (func(), error) {
	sock := StandbySocket(d.o.Dir)
	os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listening for the standby's word: %w", err)
	}
	os.Chmod(sock, 0o600)
	d.tasks.Go("standby: listening", func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			var req standbyRequest
			err = json.NewDecoder(io.LimitReader(c, maxHandover)).Decode(&req)
			c.SetReadDeadline(time.Time{})
			if err != nil || (req.Op != "go" && req.Op != "stop") {
				fmt.Fprintln(c, "error: not a standby's word")
				c.Close()
				continue
			}
			select {
			case words <- standbyWord{req, c}:
			case <-d.ctx.Done():
				c.Close()
				return
			}
		}
	})
	return func() { ln.Close(); os.Remove(sock) }, nil
}

// errDismissed ends a standby that was told to stop, or was stale.
var errDismissed = errors.New("the standby was dismissed")

// standBy is a standby keeper's wait: once the gate process has asked
// for the guest and the shim has created runsc's sandbox (d.parked), it
// tells the CLI that started it, then waits for its word. On "go" it
// takes the daemon lock and records the resume, and the start goes on
// with the word's connection as its ready pipe. It returns errDismissed
// for a stop or a stale standby, which end it without a word to the
// record.
func (d *daemon) standBy(gp *gateProc, shim *shimConn, sigs <-chan os.Signal, undo *teardown, end *ending) error {
	parked := d.parked
	var words chan standbyWord // nil until parked: no word is taken before
	for {
		var w standbyWord
		select {
		case <-parked:
			parked = nil
			words = make(chan standbyWord)
			closeSock, err := d.listenStandby(words)
			if err != nil {
				return err
			}
			defer closeSock()
			if d.o.Ready != nil {
				fmt.Fprintln(d.o.Ready, "standby")
				d.o.Ready.Close()
				d.o.Ready = nil
			}
			d.log.Info("standing by", "setup_ms", time.Since(d.started).Milliseconds())
			continue
		case w = <-words:
		case <-gp.done:
			return d.gateExited(gp, "while standing by")
		case <-shim.done:
			return fmt.Errorf("the shim exited while standing by: %v", shim.err)
		case s := <-sigs:
			if words == nil {
				return fmt.Errorf("stopped by %v while standing by", s)
			}
			d.log.Info("standby dismissed", "signal", s)
			return errDismissed
		case <-d.stopCh:
			return errors.New(cmp.Or(d.stopError, "stopped while standing by"))
		}
		if w.req.Op == "stop" {
			d.log.Info("standby dismissed")
			w.finish("stopped")
			return errDismissed
		}
		rec, err := state.Load(d.o.Dir)
		if err != nil {
			w.finish("error: " + err.Error())
			continue
		}
		ctx, cancel := context.WithTimeout(d.ctx, secretsTimeout)
		why := d.sb.stale(ctx, w.req, rec, d.readSecretSource)
		cancel()
		if why == "" && rec.State != state.StateSuspended {
			why = "the sandbox is " + rec.State + ", not suspended"
		}
		if why != "" {
			d.log.Info("standby out of date; dismissed", "why", why)
			w.finish("stale: " + why)
			return errDismissed
		}
		release, ok, err := state.TryLock(state.DaemonLock(d.o.Dir))
		if err != nil || !ok {
			w.finish("stale: another daemon runs the sandbox")
			return errDismissed
		}
		// The standby's lock goes now: from here this is the sandbox's
		// daemon, which a stop stops as any other.
		undo[stepLock]()
		undo[stepLock] = func() error { release(); return nil }
		os.Remove(standbyPID(d.o.Dir))
		d.writePID(daemonPIDFile)
		d.started = time.Now()
		// Desired is the CLI's to write, as for any start.
		if err := d.recordStart(state.StateResuming); err != nil {
			w.finish("error: " + err.Error())
			return err
		}
		undo[stepRecord] = func() error { return d.setStopped(end.reason, end.cause) }
		w.answer("go")
		d.o.Ready = w.conn
		d.log.Info("standby: go")
		close(d.standbyGo)
		return nil
	}
}

// GoStandby tells the sandbox's standby, if it has one, to resume the
// guest; env and values are what a start would hand the daemon now. It
// returns the connection, on which the daemon's word on the start
// follows ("ok", or "error: ..."), as spawning a daemon's ready pipe does.
// ErrNoStandby: there is none; a *StaleError: it was out of date and has
// exited (wait for it with WaitStandbyGone).
func GoStandby(dir string, env []string, values map[string]string) (*bufio.Reader, io.Closer, error) {
	if !state.StandbyAlive(dir) {
		return nil, nil, ErrNoStandby
	}
	c, br, err := sendStandby(dir, standbyRequest{Op: "go", Env: env, Values: values})
	if err != nil {
		return nil, nil, err
	}
	c.SetReadDeadline(time.Now().Add(time.Minute))
	line, err := br.ReadString('\n')
	c.SetReadDeadline(time.Time{})
	line = strings.TrimSpace(line)
	switch {
	case line == "go":
		return br, c, nil
	case strings.HasPrefix(line, "stale: "):
		c.Close()
		return nil, nil, &StaleError{Why: strings.TrimPrefix(line, "stale: ")}
	case strings.HasPrefix(line, "error: "):
		c.Close()
		return nil, nil, errors.New(strings.TrimPrefix(line, "error: "))
	}
	c.Close()
	if err == nil {
		err = fmt.Errorf("unexpected answer %q", line)
	}
	return nil, nil, fmt.Errorf("the standby did not answer: %w", err)
}

func sendStandby(dir string, req standbyRequest) (net.Conn, *bufio.Reader, error) {
	c, err := net.DialTimeout("unix", StandbySocket(dir), 5*time.Second)
	if err != nil {
		return nil, nil, err
	}
	c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if err := json.NewEncoder(c).Encode(req); err != nil {
		c.Close()
		return nil, nil, err
	}
	c.SetWriteDeadline(time.Time{})
	return c, bufio.NewReader(c), nil
}

// DismissStandby ends the sandbox's standby, if it has one, and waits
// until it is gone: before anything changes what a resume would restore
// (moat down, destroy, snapshot restore). A standby that does not answer
// is killed.
func DismissStandby(dir string) error {
	if !state.StandbyAlive(dir) {
		return nil
	}
	if c, br, err := sendStandby(dir, standbyRequest{Op: "stop"}); err == nil {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		br.ReadString('\n')
		c.Close()
	}
	if WaitStandbyGone(dir, 20*time.Second) == nil {
		return nil
	}
	if b, err := os.ReadFile(standbyPID(dir)); err == nil {
		if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 && state.StandbyAlive(dir) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return WaitStandbyGone(dir, 10*time.Second)
}

// WaitStandbyGone waits up to d for the sandbox's standby to exit.
func WaitStandbyGone(dir string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for state.StandbyAlive(dir) {
		if time.Now().After(deadline) {
			return fmt.Errorf("the standby of sandbox %q did not stop within %v", filepath.Base(dir), d)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}
