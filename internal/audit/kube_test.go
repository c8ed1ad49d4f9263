package audit

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"
)

// TestKubernetesFieldsFrozen pins the names added with the gate service
// on Kubernetes.
func TestKubernetesFieldsFrozen(t *testing.T) {
	when := time.Date(2026, 3, 1, 12, 30, 45, 0, time.UTC)
	got, err := json.Marshal(Record{Schema: Schema, Time: when, Sandbox: "sb-1", Proto: "tcp", Dst: "10.96.0.53:443",
		Verdict: Deny, Namespace: "agents", SandboxUID: "u1", Pod: "sb-1", PodUID: "u2", Claim: "c", ClaimUID: "u3", Template: "t"})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"schema":1,"time":"2026-03-01T12:30:45Z","sandbox":"sb-1","proto":"tcp","dst":"10.96.0.53:443",` +
		`"verdict":"deny","bytes_up":0,"bytes_down":0,"duration_ms":0,` +
		`"namespace":"agents","sandbox_uid":"u1","pod":"sb-1","pod_uid":"u2","claim":"c","claim_uid":"u3","template":"t"}`
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// TestStamp: a shared log's Stamp completes every record before it is
// written, so the file holds what Stamp added.
func TestStamp(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := OpenWith(path, Options{Stamp: func(r *Record) { r.Claim = "claim-of-" + r.Sandbox }})
	if err != nil {
		t.Fatal(err)
	}
	l.Write(Record{Sandbox: "a", Proto: "tcp", Dst: "192.0.2.1:443", Verdict: Allow})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	var recs []Record
	if err := Read(path, func(r Record) bool { recs = append(recs, r); return true }); err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Claim != "claim-of-a" {
		t.Fatalf("got %+v, want one record with claim claim-of-a", recs)
	}
}
