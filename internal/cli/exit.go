package cli

import (
	"errors"
	"fmt"

	"moat.dev/moat/internal/control"
)

// Exit codes, set only here and documented in `moat help exit-codes`.
const (
	ExitOK       = 0
	ExitError    = 1   // anything else went wrong
	ExitUsage    = 2   // bad flags, arguments or configuration
	ExitNotFound = 3   // no such sandbox or image
	ExitHost     = 4   // the host lacks something moat needs (root, runsc, a kernel feature)
	ExitRun      = 125 // run/exec/shell: moat could not run the command at all
)

const exitCodesHelp = `Exit codes:
  0    success
  1    an error (the message says what to do)
  2    bad usage: flags, arguments or configuration (moat.toml, config.toml)
  3    no such sandbox or image
  4    the host lacks something moat needs (root, runsc, a kernel feature); see: moat doctor
  125  run, exec, shell: moat could not run the command at all
  other: run, exec, shell exit with the command's own exit code
         (128+N when it was killed by signal N)
`

// exitError carries an exit code through cobra.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func withCode(code int, err error) error {
	if err == nil {
		return nil
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return err
	}
	return &exitError{code: code, err: err}
}

func codef(code int, format string, a ...any) error {
	return &exitError{code: code, err: fmt.Errorf(format, a...)}
}

// commandExit is a command's own exit status, passed through untouched.
type commandExit int

func (c commandExit) Error() string { return fmt.Sprintf("exit status %d", int(c)) }

// exitCodeOf is the guest command's own exit status in err, or -1 when
// err is not one.
func exitCodeOf(err error) int {
	var c commandExit
	if errors.As(err, &c) {
		return int(c)
	}
	return -1
}

// fromDaemon gives a control request's error its exit code: the daemon's
// 4xx (the request itself was wrong) is bad usage; anything else, the
// daemon failing or not answering, is an error, never bad usage.
func fromDaemon(err error) error {
	var he *control.HTTPError
	if errors.As(err, &he) && he.Status >= 400 && he.Status < 500 {
		return withCode(ExitUsage, err)
	}
	return withCode(ExitError, err)
}
