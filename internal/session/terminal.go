package session

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/term"
)

// terminal is the local side of a PTY session. Its zero-value parts mean
// "not a terminal": stdin can be a pipe even when a PTY was requested (a
// test, or "moat exec -t" under a script), and that must still work.
type terminal struct {
	rawFd  int         // stdin put in raw mode; -1 when stdin is not a terminal
	saved  *term.State // state to restore on rawFd
	sizeFd int         // where the window size is read; -1 when unknown
}

// defaultCols and defaultRows are used when no local terminal can be asked:
// the VT100 size every terminal program assumes.
const defaultCols, defaultRows = 80, 24

// openTerminal puts stdin in raw mode when it is a terminal, so keystrokes
// (^C, ^Z, arrows) reach the remote pty unprocessed.
func openTerminal(stdin io.Reader, stdout io.Writer) (*terminal, error) {
	t := &terminal{rawFd: -1, sizeFd: -1}
	if fd, ok := terminalFd(stdin); ok {
		saved, err := term.MakeRaw(fd)
		if err != nil {
			return nil, fmt.Errorf("putting terminal in raw mode: %w", err)
		}
		t.rawFd, t.saved, t.sizeFd = fd, saved, fd
	} else if fd, ok := terminalFd(stdout); ok {
		t.sizeFd = fd
	}
	return t, nil
}

func terminalFd(v any) (int, bool) {
	f, ok := v.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return 0, false
	}
	return int(f.Fd()), true
}

// size returns the local window size in columns and rows.
func (t *terminal) size() (cols, rows int) {
	if t != nil && t.sizeFd >= 0 {
		if w, h, err := term.GetSize(t.sizeFd); err == nil && w > 0 && h > 0 {
			return w, h
		}
	}
	return defaultCols, defaultRows
}

func (t *terminal) restore() {
	if t.saved != nil {
		term.Restore(t.rawFd, t.saved)
		t.saved = nil
	}
}
