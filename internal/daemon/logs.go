package daemon

import (
	"io"
	"os"
	"path/filepath"

	"moat.dev/moat/internal/logfile"
)

// logOut is where the daemon's log goes, for hook output.
func (d *daemon) logOut() io.Writer {
	if d.o.LogOut != nil {
		return d.o.LogOut
	}
	return os.Stderr
}

// runscLog is the write end of a pipe for the shim's stdout and stderr,
// which runsc and the guest's console inherit, and a channel closed once
// everything written to it is in runsc.log. A goroutine copies the pipe
// into runsc.log within logfile.RunscMaxBytes until the last writer is
// gone (the shim's PID namespace has died); it never stops reading
// before, or the guest's console would block.
func (d *daemon) runscLog() (*os.File, <-chan struct{}, error) {
	w, err := logfile.Open(filepath.Join(d.o.Dir, "runsc.log"), logfile.RunscMaxBytes, logfile.Options{Truncate: true})
	if err != nil {
		return nil, nil, err
	}
	r, pw, err := os.Pipe()
	if err != nil {
		w.Close()
		return nil, nil, err
	}
	done := make(chan struct{})
	d.tasks.Go("runsc.log: copying", func() {
		defer close(done)
		if n := logfile.Drain(w, r); n > 0 {
			d.log.Warn("runsc.log could not take all of runsc's output", "dropped_bytes", n)
		}
		r.Close()
		w.Close()
	})
	return pw, done, nil
}
