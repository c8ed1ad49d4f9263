package gate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"moat.dev/moat/internal/audit"
)

// WebSocket frames from a bound host. After the upgrade the proxy copies
// bytes, and a frame carries its payload's length, so a value echoed in
// a message cannot be replaced in the byte stream. wsScrubber reads the
// host's stream a frame at a time and writes each frame again with its
// payload scrubbed and its length to match. Compressed frames
// (permessage-deflate, RSV1) cannot be read: the gate takes the offer of
// compression out of the upgrade request to a bound host, and a frame
// that is compressed anyway ends the connection. A value split across two
// frames of a fragmented message is not found.

// maxScrubbedFrame bounds the payload held to scrub one frame. Messages
// an API sends are far smaller; a larger frame ends the connection rather
// than passing unscrubbed.
const maxScrubbedFrame = 16 << 20

type wsScrubber struct {
	r     io.Reader
	creds Credentials
	rs    *reqState
	out   []byte // the frame being handed on
	err   error
}

func (w *wsScrubber) Read(p []byte) (int, error) {
	for len(w.out) == 0 {
		if w.err != nil {
			return 0, w.err
		}
		w.err = w.next()
	}
	n := copy(p, w.out)
	w.out = w.out[n:]
	return n, nil
}

// drop ends the connection for a frame that cannot be scrubbed, and says
// why in the request's audit record.
func (w *wsScrubber) drop(why string) error {
	reason := audit.WebSocketUnscrubbable(why)
	w.rs.rec.Reason = reason
	return errors.New(string(reason))
}

// next reads one frame and makes w.out its scrubbed form.
func (w *wsScrubber) next() error {
	var h [2]byte
	if _, err := io.ReadFull(w.r, h[:]); err != nil {
		return err
	}
	if h[0]&0x70 != 0 {
		return w.drop("a compressed frame (RSV bits set)")
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(w.r, b[:]); err != nil {
			return err
		}
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(w.r, b[:]); err != nil {
			return err
		}
		n = binary.BigEndian.Uint64(b[:])
	}
	var key [4]byte
	masked := h[1]&0x80 != 0
	if masked {
		if _, err := io.ReadFull(w.r, key[:]); err != nil {
			return err
		}
	}
	if n > maxScrubbedFrame {
		return w.drop(fmt.Sprintf("a frame of %d bytes, more than the %d MiB held to scrub one", n, maxScrubbedFrame>>20))
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(w.r, payload); err != nil {
		return err
	}
	if masked {
		for i := range payload {
			payload[i] ^= key[i%4]
		}
	}
	out := []byte(w.creds.ScrubString(string(payload)))
	if opcode := h[0] & 0x0f; opcode >= 8 && len(out) > 125 {
		// A control frame's payload is at most 125 bytes: a close keeps
		// its status code, a ping or pong its first bytes.
		out = out[:125]
	}
	// A server's frames are not masked; one that was is sent as it
	// should have been.
	w.out = append(frameHead(h[0], len(out)), out...)
	return nil
}

func frameHead(b0 byte, n int) []byte {
	switch {
	case n <= 125:
		return []byte{b0, byte(n)}
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16([]byte{b0, 126}, uint16(n))
	}
	return binary.BigEndian.AppendUint64([]byte{b0, 127}, uint64(n))
}

// wsScrubbing is the upstream's end of an upgraded connection whose reads
// go through a wsScrubber.
type wsScrubbing struct {
	io.ReadWriteCloser
	s *wsScrubber
}

func (c *wsScrubbing) Read(p []byte) (int, error) { return c.s.Read(p) }
