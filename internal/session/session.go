// Package session is the host half of one command in a sandbox: it opens an
// SSH session to the guest agent, wires the local terminal or pipes to it,
// and returns the command's exit code.
package session

import (
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"moat.dev/moat/internal/agent"
)

// ErrConnectionLost is returned when the session ended without an exit status.
var ErrConnectionLost = errors.New("connection to the sandbox lost")

// Options describe one command.
type Options struct {
	Argv   []string // empty: interactive shell
	TTY    bool
	Dir    string
	Env    map[string]string
	Term   string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

var sigNames = map[os.Signal]ssh.Signal{
	syscall.SIGINT: ssh.SIGINT, syscall.SIGTERM: ssh.SIGTERM, syscall.SIGHUP: ssh.SIGHUP, syscall.SIGQUIT: ssh.SIGQUIT,
}

// Run runs the command and returns its exit code (128+N for signal N).
func Run(ctx context.Context, c *ssh.Client, o Options) (int, error) {
	s, err := c.NewSession()
	if err != nil {
		return 0, err
	}
	defer s.Close()
	if o.Dir != "" {
		s.Setenv("MOAT_CWD", o.Dir)
	}
	for k, v := range o.Env {
		s.Setenv(k, v)
	}
	s.Stdout, s.Stderr = o.Stdout, o.Stderr
	stdin, err := s.StdinPipe()
	if err != nil {
		return 0, err
	}
	go func() {
		if o.Stdin != nil {
			io.Copy(stdin, o.Stdin)
		}
		stdin.Close()
	}()

	sigs := make(chan os.Signal, 4)
	if o.TTY {
		fd := -1
		if f, ok := o.Stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			fd = int(f.Fd())
		}
		cols, rows := 80, 24
		if fd >= 0 {
			if w, h, err := term.GetSize(fd); err == nil {
				cols, rows = w, h
			}
			old, err := term.MakeRaw(fd)
			if err == nil {
				defer term.Restore(fd, old)
			}
		}
		t := o.Term
		if t == "" {
			t = os.Getenv("TERM")
		}
		if t == "" {
			t = "xterm-256color"
		}
		if err := s.RequestPty(t, rows, cols, ssh.TerminalModes{}); err != nil {
			return 0, err
		}
		if fd >= 0 {
			signal.Notify(sigs, unix.SIGWINCH)
			defer signal.Stop(sigs)
			go func() {
				for range sigs {
					if w, h, err := term.GetSize(fd); err == nil {
						s.WindowChange(h, w)
					}
				}
			}()
		}
	} else {
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
		defer signal.Stop(sigs)
		go func() {
			for sg := range sigs {
				s.Signal(sigNames[sg])
			}
		}()
	}
	if len(o.Argv) == 0 {
		err = s.Shell()
	} else {
		err = s.Start(agent.QuoteArgs(o.Argv))
	}
	if err != nil {
		return 0, err
	}
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	err = s.Wait()
	if err == nil {
		return 0, nil
	}
	var ee *ssh.ExitError
	if errors.As(err, &ee) {
		if ee.Signal() != "" {
			return 128 + sigNum(ee.Signal()), nil
		}
		return ee.ExitStatus(), nil
	}
	var miss *ssh.ExitMissingError
	if errors.As(err, &miss) || errors.Is(err, io.EOF) {
		return 0, ErrConnectionLost
	}
	return 0, err
}

func sigNum(name string) int {
	for s, n := range sigNames {
		if string(n) == name {
			return int(s.(syscall.Signal))
		}
	}
	return 9
}
