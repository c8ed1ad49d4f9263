package agent

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/crypto/ssh"
)

// sessionState is what a session's requests have set before it starts.
type sessionState struct {
	env        []string
	dir        string
	pty        bool
	term       string
	cols, rows uint16
}

// signals maps RFC 4254 names to signals.
var signals = map[string]syscall.Signal{
	"ABRT": syscall.SIGABRT, "ALRM": syscall.SIGALRM, "FPE": syscall.SIGFPE, "HUP": syscall.SIGHUP,
	"ILL": syscall.SIGILL, "INT": syscall.SIGINT, "KILL": syscall.SIGKILL, "PIPE": syscall.SIGPIPE,
	"QUIT": syscall.SIGQUIT, "SEGV": syscall.SIGSEGV, "TERM": syscall.SIGTERM, "USR1": syscall.SIGUSR1,
	"USR2": syscall.SIGUSR2,
}

func (s *Server) serveSession(ctx context.Context, nch ssh.NewChannel) {
	ch, reqs, err := nch.Accept()
	if err != nil {
		return
	}
	defer ch.Close()
	st := &sessionState{dir: s.defaultDir(), term: "xterm-256color"}
	var (
		mu      sync.Mutex
		ptmx    *os.File
		pgid    int
		started bool
		done    = make(chan int, 1)
	)
	for {
		var req *ssh.Request
		select {
		case req = <-reqs:
		case code := <-done:
			s.finish(ch, code)
			return
		case <-ctx.Done():
			mu.Lock()
			killGroup(pgid)
			mu.Unlock()
			return
		}
		if req == nil {
			// The client closed the channel: nothing may outlive it.
			mu.Lock()
			killGroup(pgid)
			mu.Unlock()
			if started {
				select {
				case <-done:
				case <-time.After(2 * time.Second):
				}
			}
			return
		}
		ok := true
		switch req.Type {
		case "env":
			var kv struct{ Name, Value string }
			if ssh.Unmarshal(req.Payload, &kv) != nil {
				ok = false
				break
			}
			if kv.Name == "MOAT_CWD" {
				st.dir = kv.Value
			} else {
				st.env = append(st.env, kv.Name+"="+kv.Value)
			}
		case "pty-req":
			var p struct {
				Term                 string
				Cols, Rows, W, H     uint32
				Modes                string
			}
			if ssh.Unmarshal(req.Payload, &p) != nil {
				ok = false
				break
			}
			st.pty, st.cols, st.rows = true, uint16(p.Cols), uint16(p.Rows)
			if p.Term != "" {
				st.term = p.Term
			}
		case "window-change":
			if len(req.Payload) >= 8 {
				cols := binary.BigEndian.Uint32(req.Payload)
				rows := binary.BigEndian.Uint32(req.Payload[4:])
				mu.Lock()
				if ptmx != nil {
					pty.Setsize(ptmx, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)})
				}
				mu.Unlock()
			}
		case "signal":
			var sig struct{ Name string }
			ssh.Unmarshal(req.Payload, &sig)
			mu.Lock()
			if n, found := signals[sig.Name]; found && pgid > 0 {
				syscall.Kill(-pgid, n)
			}
			mu.Unlock()
		case "exec", "shell":
			if started {
				ok = false
				break
			}
			var argv []string
			if req.Type == "exec" {
				var c struct{ Command string }
				if ssh.Unmarshal(req.Payload, &c) != nil {
					ok = false
					break
				}
				argv = []string{s.shell(), "-c", c.Command}
			} else {
				argv = []string{s.shell(), "-l"}
			}
			if fi, err := os.Stat(st.dir); err != nil || !fi.IsDir() {
				fmt.Fprintf(ch.Stderr(), "moat: working directory %s does not exist in the sandbox\n", st.dir)
				req.Reply(true, nil)
				s.finish(ch, 1)
				return
			}
			p, g, err := s.start(ch, st, argv, done)
			if err != nil {
				fmt.Fprintf(ch.Stderr(), "moat: starting %s: %v\n", argv[0], err)
				req.Reply(true, nil)
				s.finish(ch, 127)
				return
			}
			mu.Lock()
			ptmx, pgid, started = p, g, true
			mu.Unlock()
		default:
			ok = false
		}
		if req.WantReply {
			req.Reply(ok, nil)
		}
	}
}

func (s *Server) finish(ch ssh.Channel, code int) {
	ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(code)}))
	ch.Close()
}

func killGroup(pgid int) {
	if pgid > 0 {
		syscall.Kill(-pgid, syscall.SIGKILL)
	}
}

// start runs argv for the session; done receives the exit code once all
// output has been copied and the group has been killed.
func (s *Server) start(ch ssh.Channel, st *sessionState, argv []string, done chan<- int) (*os.File, int, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = st.dir
	env := append([]string{}, s.Env...)
	env = append(env, "SHELL="+s.shell(), "TERM="+st.term)
	cmd.Env = mergeEnv(env, st.env)
	attr := &syscall.SysProcAttr{Credential: s.credential()}
	if st.pty {
		attr.Setsid, attr.Setctty = true, true
		cmd.SysProcAttr = attr
		ptmx, err := pty.StartWithAttrs(cmd, &pty.Winsize{Cols: st.cols, Rows: st.rows}, attr)
		if err != nil {
			return nil, 0, err
		}
		go io.Copy(ptmx, ch)
		copied := make(chan struct{})
		go func() { io.Copy(ch, ptmx); close(copied) }()
		pgid := cmd.Process.Pid
		go func() {
			err := cmd.Wait()
			// Output still in the pty buffer is drained before the status.
			select {
			case <-copied:
			case <-time.After(500 * time.Millisecond):
			}
			killGroup(pgid)
			ptmx.Close()
			done <- exitCode(err)
		}()
		return ptmx, pgid, nil
	}
	attr.Setpgid = true
	cmd.SysProcAttr = attr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, 0, err
	}
	cmd.Stdout, cmd.Stderr = ch, ch.Stderr()
	// A background child that keeps stdout open must not hold the session:
	// once the command exits, output gets 1 s more, then its group is killed.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return nil, 0, err
	}
	go func() { io.Copy(stdin, ch); stdin.Close() }()
	pgid := cmd.Process.Pid
	go func() {
		err := cmd.Wait()
		killGroup(pgid)
		done <- exitCode(err)
	}()
	return nil, pgid, nil
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return 1
}

// mergeEnv lets the client's variables override the base.
func mergeEnv(base, over []string) []string {
	idx := map[string]int{}
	out := append([]string{}, base...)
	for i, kv := range out {
		idx[strings.SplitN(kv, "=", 2)[0]] = i
	}
	for _, kv := range over {
		k := strings.SplitN(kv, "=", 2)[0]
		if i, ok := idx[k]; ok {
			out[i] = kv
		} else {
			idx[k] = len(out)
			out = append(out, kv)
		}
	}
	return out
}

// QuoteArgs quotes argv for sh -c, as OpenSSH clients do.
func QuoteArgs(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") == "" {
			q[i] = a
		} else {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}
