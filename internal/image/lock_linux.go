package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

const (
	lockShared    = unix.LOCK_SH
	lockExclusive = unix.LOCK_EX
)

// lockPoll is how often a waiting lock retries: short next to unpacking a layer, long enough not
// to spin.
const lockPoll = 50 * time.Millisecond

// lockFile takes a flock on path (created if missing) and returns its release. flock, not fcntl,
// because flock locks belong to the open file, so two goroutines of one process exclude each other
// just as two processes do. It polls with LOCK_NB so a cancelled context stops the wait.
func lockFile(ctx context.Context, path string, how int) (release func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing the file drops the lock
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for lock %s: %w", path, ctx.Err())
		case <-time.After(lockPoll):
		}
	}
}
