package daemon

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/crypto/ssh"

	"moat.dev/moat/internal/guest"
	"moat.dev/moat/internal/keys"
	"moat.dev/moat/internal/runtime"
	"moat.dev/moat/internal/state"
)

// A sandbox made by moat fork is first restored from its parent's image,
// whose agent knows only the parent's keys. The CLI puts the parent's
// client key and the agent's public host key in runtime.ForkKeysDir; the
// gate process connects with them once, before any session, and asks the
// guest to take the fork's own identity (guest.ForkRequest): its keys,
// its placeholders and its CA, which this start wrote into the fork's
// guest directory. The shim deletes the parent's keys once the guest is
// restored (and a start that boots afresh deletes them with the image),
// so they serve that one connection. A guest that refuses keeps the
// parent's keys, and the start fails closed: the proxy authenticates only
// with the fork's.

// forkKeys are the parent's keys a fork's first restore connects with.
type forkKeys struct {
	client ssh.Signer
	host   ssh.PublicKey
}

// errForkUnknown: the restored guest does not know guest.ForkRequest.
var errForkUnknown = errors.New("the forked guest runs a moat from before moat fork and cannot take this sandbox's keys; its saved processes are dropped: start it again to boot it afresh with its files")

// forkRekeyTimeout bounds the rekey connection: a handshake and the
// guest rewriting its trust stores.
const forkRekeyTimeout = 30 * time.Second

// loadForkKeys reads the parent's keys when this start restores a fork;
// nil otherwise.
func (d *daemon) loadForkKeys() (*forkKeys, error) {
	dir := runtime.ForkKeysDir(d.o.Dir)
	if _, err := os.Stat(dir); err != nil {
		return nil, nil
	}
	// Resuming; or suspended, in a standby's gate process, whose
	// record says resuming only from its word to go (standby.go).
	if rec, err := d.record(); err != nil || (rec.State != state.StateResuming && rec.State != state.StateSuspended) {
		return nil, nil // booting afresh: the fork's own keys serve
	}
	client, err := keys.Client(dir)
	if err != nil {
		return nil, fmt.Errorf("reading the parent's keys of this fork: %w", err)
	}
	host, err := keys.HostPublic(dir)
	if err != nil {
		return nil, fmt.Errorf("reading the parent's keys of this fork: %w", err)
	}
	return &forkKeys{client: client, host: host}, nil
}

// takeForkIdentity asks the restored guest, on c, to take the fork's own
// identity.
func (d *daemon) takeForkIdentity(c net.Conn) error {
	defer c.Close()
	c.SetDeadline(time.Now().Add(forkRekeyTimeout))
	cfg := &ssh.ClientConfig{
		User:            "moat",
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(d.fork.client)},
		HostKeyCallback: ssh.FixedHostKey(d.fork.host),
		Timeout:         forkRekeyTimeout,
	}
	conn, chans, reqs, err := ssh.NewClientConn(c, filepath.Base(d.o.Dir), cfg)
	if err != nil {
		return fmt.Errorf("connecting with the parent's keys: %w", err)
	}
	defer conn.Close()
	go ssh.DiscardRequests(reqs)
	go func() {
		for ch := range chans {
			ch.Reject(ssh.Prohibited, "no channels")
		}
	}()
	ok, reply, err := conn.SendRequest(guest.ForkRequest, true, nil)
	if err != nil {
		return err
	}
	if !ok {
		if len(reply) == 0 {
			// An agent that does not know the request: a parent suspended
			// by a moat from before fork. Waiting would not change it.
			return errForkUnknown
		}
		return errors.New("the guest refused: " + string(reply))
	}
	d.log.Info("fork: the restored guest took this sandbox's own keys, placeholders and CA")
	return nil
}
