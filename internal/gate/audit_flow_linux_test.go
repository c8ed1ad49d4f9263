package gate

import (
	"bytes"
	"encoding/json"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/testfs"
)

// Threat model 37: a connection allowed before the disk filled and ending while
// it was full lost its record, written only at its end. Its decision is
// now on record while it is open, and its end, written into the log's
// reserve, is whole: start and end share a flow id. On a 2 MiB tmpfs,
// filled while the connection is open.
func TestConnectionRecordedWhenDecided(t *testing.T) {
	dir := testfs.Small(t, "2m")
	a := loopback()
	ln := listenAt(t, a+":2222")
	release := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		io.WriteString(c, "SSH-2.0-test\r\n")
		<-release
		c.Close()
	}()
	// The address rule opens the loopback address the test server is on.
	f := newFixture(t, nil, []string{"ssh.allowed.test:2222", a + "/32"}, nil)
	path := filepath.Join(dir, "audit.jsonl")
	al, err := audit.Open(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close()
	f.g.o.Audit = al
	f.g.Bindings().Add("ssh.allowed.test", []netip.Addr{netip.MustParseAddr(a)}, "observed", time.Now().Add(time.Minute))

	r := f.flow(t, a+":2222")
	if !r.accepted {
		t.Fatal("the allowed destination was refused")
	}
	r.guest.SetDeadline(time.Now().Add(5 * time.Second))
	banner := make([]byte, 14)
	if _, err := io.ReadFull(r.guest, banner); err != nil {
		t.Fatalf("reading the banner: %v", err)
	}

	// Open, and already on record.
	var start audit.Record
	for deadline := time.Now().Add(5 * time.Second); start.Flow == ""; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no start record within 5 s of the connection's decision")
		}
		audit.Read(path, func(rec audit.Record) bool {
			if rec.Phase == audit.PhaseStart {
				start = rec
			}
			return true
		})
	}
	if start.Verdict != audit.Allow || start.Name != "ssh.allowed.test" || start.Rule != "ssh.allowed.test:2222" || start.Upstream != a+":2222" {
		t.Fatalf("start record %+v", start)
	}

	filler := testfs.Fill(t, dir)
	defer os.Remove(filler)
	close(release)
	r.guest.Close()
	<-r.done
	if err := al.Close(); err != nil {
		t.Logf("the log's error on a full disk: %v", err)
	}
	var ends []audit.Record
	if err := audit.Read(path, func(rec audit.Record) bool {
		if rec.Phase == audit.PhaseEnd {
			ends = append(ends, rec)
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if len(ends) != 1 || ends[0].Flow != start.Flow || ends[0].BytesDown != int64(len(banner)) || ends[0].Verdict != audit.Allow {
		t.Fatalf("end records %+v; want one for flow %s with %d bytes down", ends, start.Flow, len(banner))
	}
	if n := al.Lost(); n != 0 {
		t.Errorf("%d records lost: the end did not fit in the reserve", n)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range bytes.SplitAfter(data, []byte("\n")) {
		if len(line) > 0 && (line[len(line)-1] != '\n' || !json.Valid(line)) {
			t.Errorf("a torn line: %.80q", line)
		}
	}
}
