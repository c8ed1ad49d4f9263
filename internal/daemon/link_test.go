package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

func TestLinkCallsBothWaysWithFiles(t *testing.T) {
	a, b, err := linkPair()
	if err != nil {
		t.Fatal(err)
	}
	keeper, err := newLink(a, maxLinkRequest, func(ctx context.Context, m string, body json.RawMessage) (any, []*os.File, error) {
		switch m {
		case "echo":
			var s string
			json.Unmarshal(body, &s)
			return strings.ToUpper(s), nil, nil
		case "file":
			r, w, err := os.Pipe()
			if err != nil {
				return nil, nil, err
			}
			w.WriteString("through the pipe")
			w.Close()
			return nil, []*os.File{r}, nil
		}
		return nil, nil, errors.New("no method " + m)
	}, &tasks{})
	if err != nil {
		t.Fatal(err)
	}
	gate, err := newLink(b, maxLinkMessage, nil, &tasks{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got string
	if _, err := gate.call(ctx, "echo", "hi", &got); err != nil || got != "HI" {
		t.Fatalf("echo: %q, %v", got, err)
	}
	fds, err := gate.call(ctx, "file", nil, nil)
	if err != nil || len(fds) != 1 {
		t.Fatalf("file: %d fds, %v", len(fds), err)
	}
	if b, _ := io.ReadAll(fds[0]); string(b) != "through the pipe" {
		t.Fatalf("read %q from the passed fd", b)
	}
	fds[0].Close()
	if _, err := gate.call(ctx, "nope", nil, nil); err == nil || !strings.Contains(err.Error(), "no method nope") {
		t.Fatalf("unknown method: %v", err)
	}
	// The gate serves nothing: the keeper's call gets an error, not a hang.
	if _, err := keeper.call(ctx, "echo", "x", nil); err == nil {
		t.Fatal("a call to a side that serves nothing succeeded")
	}
	// A request over the keeper's bound ends the link rather than
	// being read.
	if _, err := gate.call(ctx, "echo", strings.Repeat("x", maxLinkRequest), nil); err == nil {
		t.Fatalf("an oversized request: %v", err)
	}
	select {
	case <-keeper.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the keeper kept reading after an oversized request")
	}
}
