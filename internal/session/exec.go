package session

import (
	"context"
	"fmt"
	"io"

	"moat.dev/moat/internal/agent"
)

// Exec runs argv in the guest on the proxy's own connection, with the
// daemon as the client: set-up hooks run this way, before any CLI is
// attached. Unlike Run it leaves this process's signals alone (a daemon
// must still stop on SIGTERM while a hook runs) and has no terminal; the
// command is killed when ctx ends.
func (p *Proxy) Exec(ctx context.Context, o Options) (int, error) {
	c, err := p.guestClient(ctx)
	if err != nil {
		return exitFailed, fmt.Errorf("connecting to the guest agent: %w", err)
	}
	sess, err := c.NewSession()
	if err != nil {
		return exitFailed, fmt.Errorf("opening session: %w", err)
	}
	defer sess.Close()
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()
	if err := sendEnv(sess, o); err != nil {
		return exitFailed, err
	}
	if o.Stdin == nil {
		o.Stdin = eofReader{}
	}
	sess.Stdin, sess.Stdout, sess.Stderr = o.Stdin, o.Stdout, o.Stderr
	if err := sess.Start(agent.QuoteArgs(o.Argv)); err != nil {
		return exitFailed, fmt.Errorf("starting %q: %w", o.Argv, err)
	}
	code, err := exitStatus(sess.Wait())
	if ctx.Err() != nil {
		return exitFailed, fmt.Errorf("running %q: %w", o.Argv, ctx.Err())
	}
	return code, err
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }
