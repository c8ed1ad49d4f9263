package daemon

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// A link is the one channel between the daemon's two processes (see
// docs/architecture.md, "Privilege separation"): the privileged keeper
// and the unprivileged gate process. Either side calls a method of the
// other and waits for its answer; an answer may carry file descriptors
// (an ssh-agent connection). Messages are length-prefixed JSON on a unix
// stream socket, the descriptors riding with the length.
//
// The keeper treats everything that arrives on it as hostile: the gate
// process is the one a guest would compromise. So every method the keeper
// serves takes a small typed request, bounds it and checks it against the
// sandbox's own configuration, and none of them reads a path or runs a
// command the request names.
type link struct {
	c       *net.UnixConn
	maxIn   uint32 // the largest message read: see newLink
	handler func(ctx context.Context, method string, body json.RawMessage) (any, []*os.File, error)

	wmu     sync.Mutex // one message at a time on the socket
	next    atomic.Uint64
	mu      sync.Mutex // guards pending and err
	pending map[uint64]chan linkMsg
	err     error // set once the link is down
	done    chan struct{}

	// The link's goroutines (its reader and one per call it answers)
	// are its process's tasks; ctx, which the calls it answers get,
	// ends with the link, so that none of them outlives it for long.
	run    *tasks
	ctx    context.Context
	cancel context.CancelFunc
}

// Bounds of a message: what the keeper sends can be as large as a named
// policy's list; what it reads is a small request, and a gate process
// sending more is one to stop listening to.
const (
	maxLinkMessage = 64 << 20
	maxLinkRequest = 1 << 20
)

// maxLinkFDs bounds the descriptors one message may carry.
const maxLinkFDs = 4

type linkMsg struct {
	ID     uint64          `json:"id"`
	Method string          `json:"m,omitempty"` // a call; empty in an answer
	Body   json.RawMessage `json:"b,omitempty"`
	Error  string          `json:"e,omitempty"`
	fds    []*os.File
}

// errLinkDown is a call's error once the other process is gone.
var errLinkDown = errors.New("the daemon's other process is gone")

// newLink runs a link on f, answering the other side's calls with handler
// (nil: none are served) and reading messages of at most maxIn bytes. It
// reads until the socket ends; done is closed then. Its goroutines run
// as run's tasks.
func newLink(f *os.File, maxIn uint32, handler func(ctx context.Context, method string, body json.RawMessage) (any, []*os.File, error), run *tasks) (*link, error) {
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("link: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, errors.New("link: not a unix socket")
	}
	l := &link{c: uc, maxIn: maxIn, handler: handler, pending: map[uint64]chan linkMsg{}, done: make(chan struct{}), run: run}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	run.Go("link: reading", l.read)
	return l, nil
}

// linkPair makes the socket pair a link runs on: one end for each process.
func linkPair() (ours, theirs *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the link: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "link"), os.NewFile(uintptr(fds[1]), "link"), nil
}

// call asks the other side for method with req and decodes its answer
// into resp (which may be nil). fds are the descriptors the answer
// carried; the caller owns them.
func (l *link) call(ctx context.Context, method string, req, resp any) ([]*os.File, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	id := l.next.Add(1)
	ch := make(chan linkMsg, 1)
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return nil, l.err
	}
	l.pending[id] = ch
	l.mu.Unlock()
	if err := l.send(linkMsg{ID: id, Method: method, Body: body}); err != nil {
		l.forget(id)
		return nil, err
	}
	select {
	case m, ok := <-ch:
		if !ok {
			return nil, errLinkDown
		}
		if m.Error != "" {
			closeFiles(m.fds)
			return nil, errors.New(m.Error)
		}
		if resp != nil && len(m.Body) > 0 {
			if err := json.Unmarshal(m.Body, resp); err != nil {
				closeFiles(m.fds)
				return nil, fmt.Errorf("link: the answer to %s: %w", method, err)
			}
		}
		return m.fds, nil
	case <-ctx.Done():
		l.forget(id)
		return nil, ctx.Err()
	}
}

func (l *link) forget(id uint64) {
	l.mu.Lock()
	delete(l.pending, id)
	l.mu.Unlock()
}

// Close ends the link; the other side's reads end.
func (l *link) Close() error { return l.c.Close() }

func (l *link) send(m linkMsg) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if len(b) > maxLinkMessage {
		return fmt.Errorf("link: a %d-byte message is over the bound", len(b))
	}
	msg := make([]byte, 4, 4+len(b))
	binary.BigEndian.PutUint32(msg, uint32(len(b)))
	msg = append(msg, b...)
	var oob []byte
	if len(m.fds) > 0 {
		fds := make([]int, len(m.fds))
		for i, f := range m.fds {
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	n, _, err := l.c.WriteMsgUnix(msg, oob, nil)
	if err == nil && n < len(msg) {
		// The socket took part of it; the rest goes without descriptors.
		_, err = l.c.Write(msg[n:])
	}
	return err
}

// read takes messages until the socket ends, answering calls and
// delivering answers.
func (l *link) read() {
	err := l.readLoop()
	// Whatever ended the reading ends the link: a writer on the other
	// side must not wait on a socket nobody reads, and a call still
	// being answered has no one to answer to.
	l.c.Close()
	l.cancel()
	l.mu.Lock()
	l.err = errLinkDown
	for id, ch := range l.pending {
		close(ch)
		delete(l.pending, id)
	}
	l.mu.Unlock()
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		l.mu.Lock()
		l.err = fmt.Errorf("%w: %v", errLinkDown, err)
		l.mu.Unlock()
	}
	close(l.done)
}

func (l *link) readLoop() error {
	hdr := make([]byte, 4)
	oob := make([]byte, unix.CmsgSpace(4*maxLinkFDs))
	for {
		n, oobn, _, _, err := l.c.ReadMsgUnix(hdr, oob)
		if err != nil {
			return err
		}
		if n == 0 {
			return io.EOF
		}
		fds, err := parseRights(oob[:oobn])
		if err != nil {
			return err
		}
		if n < 4 {
			if _, err := io.ReadFull(l.c, hdr[n:]); err != nil {
				closeFiles(fds)
				return err
			}
		}
		size := binary.BigEndian.Uint32(hdr)
		if size > l.maxIn {
			closeFiles(fds)
			return fmt.Errorf("link: a %d-byte message is over the bound", size)
		}
		b := make([]byte, size)
		if _, err := io.ReadFull(l.c, b); err != nil {
			closeFiles(fds)
			return err
		}
		var m linkMsg
		if err := json.Unmarshal(b, &m); err != nil {
			closeFiles(fds)
			return fmt.Errorf("link: %w", err)
		}
		m.fds = fds
		if m.Method == "" {
			l.mu.Lock()
			ch, ok := l.pending[m.ID]
			delete(l.pending, m.ID)
			l.mu.Unlock()
			if ok {
				ch <- m
			} else {
				closeFiles(fds)
			}
			continue
		}
		closeFiles(fds) // calls carry none
		l.run.Go("link: answering "+truncate(m.Method, 32), func() { l.answer(m) })
	}
}

func (l *link) answer(m linkMsg) {
	out := linkMsg{ID: m.ID}
	if l.handler == nil {
		out.Error = "no calls are served here"
	} else {
		resp, fds, err := l.handler(l.ctx, m.Method, m.Body)
		if err != nil {
			out.Error = err.Error()
		} else if out.Body, err = json.Marshal(resp); err != nil {
			out.Error = err.Error()
		}
		out.fds = fds
		defer closeFiles(fds)
	}
	l.send(out)
}

func parseRights(oob []byte) ([]*os.File, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("link: %w", err)
	}
	var out []*os.File
	for i := range msgs {
		fds, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue
		}
		for _, fd := range fds {
			unix.CloseOnExec(fd)
			out = append(out, os.NewFile(uintptr(fd), "passed"))
		}
	}
	return out, nil
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}
