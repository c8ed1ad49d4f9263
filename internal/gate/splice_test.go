package gate

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

// chunkReader returns at most n bytes a read, as a socket does.
type chunkReader struct {
	r io.Reader
	n int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(p) > c.n {
		p = p[:c.n]
	}
	return c.r.Read(p)
}

// sizes records the length of every write.
type sizes struct {
	bytes.Buffer
	writes []int
}

func (s *sizes) Write(p []byte) (int, error) {
	s.writes = append(s.writes, len(p))
	return s.Buffer.Write(p)
}

func TestSpliceCopiesAndGrowsForBulk(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	var dst sizes
	n, err := splice(&dst, &chunkReader{bytes.NewReader(data), 1 << 20})
	if err != nil || n != int64(len(data)) || !bytes.Equal(dst.Bytes(), data) {
		t.Fatalf("splice: %d, %v; copied equal: %v", n, err, bytes.Equal(dst.Bytes(), data))
	}
	// The first read fills the small buffer; the rest go through the
	// large one.
	if dst.writes[0] != spliceSmall || dst.writes[1] != spliceLarge {
		t.Fatalf("write sizes %v, want %d then %d", dst.writes[:2], spliceSmall, spliceLarge)
	}
}

func TestSpliceStaysSmallForTrickles(t *testing.T) {
	var dst sizes
	data := bytes.Repeat([]byte("x"), 100*1000)
	if _, err := splice(&dst, &chunkReader{bytes.NewReader(data), 1000}); err != nil {
		t.Fatal(err)
	}
	for _, w := range dst.writes {
		if w > 1000 {
			t.Fatalf("a write of %d bytes from reads of at most 1000", w)
		}
	}
	if dst.Len() != len(data) {
		t.Fatalf("copied %d of %d", dst.Len(), len(data))
	}
}

func TestSpliceErrors(t *testing.T) {
	boom := errors.New("boom")
	// Data that comes with the error is written first.
	var dst bytes.Buffer
	n, err := splice(&dst, iotest.DataErrReader(io.MultiReader(bytes.NewReader([]byte("tail")), iotest.ErrReader(boom))))
	if !errors.Is(err, boom) || n != 4 || dst.String() != "tail" {
		t.Fatalf("read error: %d, %v, %q", n, err, dst.String())
	}
	// A failing writer stops the copy with its error.
	n, err = splice(errWriter{boom}, bytes.NewReader([]byte("data")))
	if !errors.Is(err, boom) || n != 0 {
		t.Fatalf("write error: %d, %v", n, err)
	}
}

type errWriter struct{ err error }

func (w errWriter) Write([]byte) (int, error) { return 0, w.err }
