package gateserve

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/kubert"
	"moat.dev/moat/internal/termtest"
)

// The audit container's stdout: the file's records from its start, then
// each new one, one JSON record a line, until stopped.
func TestFollowAudit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubernetes.jsonl")
	rec := func(name string) string {
		b, _ := json.Marshal(audit.Record{Time: time.Now().UTC(), Verdict: audit.Deny, Proto: "tcp", Name: name, Claim: "c", ClaimUID: "u"})
		return string(b) + "\n"
	}
	if err := os.WriteFile(path, []byte(rec("one.example")+"not a record\n"+rec("two.example")), 0o600); err != nil {
		t.Fatal(err)
	}
	var out termtest.Screen
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- FollowAudit(ctx, path, &out) }()
	wait := func(n int) []string {
		deadline := time.Now().Add(10 * time.Second)
		for {
			if l := lines(&out); len(l) >= n && l[0] != "" {
				return l
			}
			if time.Now().After(deadline) {
				t.Fatalf("after 10 s, FollowAudit wrote %q; want %d records", lines(&out), n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	wait(2)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(rec("three.example"))
	f.Close()
	lines := wait(3)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("FollowAudit: %v", err)
	}
	var names []string
	for _, l := range lines {
		var r audit.Record
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("line %q is not a record: %v", l, err)
		}
		if r.ClaimUID != "u" {
			t.Errorf("record %q lost its claim_uid", l)
		}
		names = append(names, r.Name)
	}
	if strings.Join(names, " ") != "one.example two.example three.example" {
		t.Errorf("FollowAudit wrote %v; want the three records in order, the damaged line skipped", names)
	}
}

// moat-kube writes the claim's Secret under the name the gate reads; the
// two packages cannot share the constant (moat would link the gate).
func TestSecretAnnotationAgrees(t *testing.T) {
	if kubert.AnnotationSecret != AnnotationSecret {
		t.Errorf("kubert.AnnotationSecret = %q, the gate reads %q", kubert.AnnotationSecret, AnnotationSecret)
	}
}
