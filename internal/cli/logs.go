package cli

import (
	"fmt"
	"io"
	"os"
	"time"
)

// printLog copies the log at path to out; with follow, it keeps copying
// while alive() says the writer lives, and follows the log across its
// rotations (internal/logfile): once the file at path is a new one, what
// is left of the old one is printed, then the new one from its start.
func printLog(out io.Writer, path string, follow bool, alive func() bool) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("opening the daemon log: %w", err)
	}
	defer func() { f.Close() }()
	for {
		if _, err := io.Copy(out, f); err != nil {
			return err
		}
		if !follow || !alive() {
			_, err := io.Copy(out, f)
			return err
		}
		if rotated(f, path) {
			io.Copy(out, f)
			nf, err := os.Open(path)
			if err == nil {
				f.Close()
				f = nf
				continue
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// rotated says whether path is no longer the file f has open.
func rotated(f *os.File, path string) bool {
	a, err1 := f.Stat()
	b, err2 := os.Stat(path)
	return err1 == nil && err2 == nil && !os.SameFile(a, b)
}
