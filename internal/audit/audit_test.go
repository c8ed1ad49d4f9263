package audit

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestRecordJSONFrozen pins the wire names. If this test fails, a change
// broke every audit log already written and every script reading them:
// add a field instead.
func TestRecordJSONFrozen(t *testing.T) {
	r := Record{
		Schema:     Schema,
		Time:       time.Date(2026, 3, 1, 12, 30, 45, 123456789, time.UTC),
		Sandbox:    "api",
		Proto:      "tcp",
		Dst:        "198.18.0.7:443",
		Name:       "evil.example",
		NameFrom:   "pool",
		Verdict:    "deny",
		Rule:       "*.example",
		Layer:      "project",
		Reason:     "blocked",
		Upstream:   "203.0.113.9:443",
		BytesUp:    517,
		BytesDown:  4096,
		DurationMS: 12,
		Transforms: []string{"ANTHROPIC_API_KEY"},
		Dropped:    3,
		Method:     "POST",
		Path:       "/v1/messages",
		Status:     201,
	}
	got, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"schema":1,"time":"2026-03-01T12:30:45.123456789Z","sandbox":"api","proto":"tcp",` +
		`"dst":"198.18.0.7:443","name":"evil.example","name_from":"pool","verdict":"deny",` +
		`"rule":"*.example","layer":"project","reason":"blocked","upstream":"203.0.113.9:443",` +
		`"bytes_up":517,"bytes_down":4096,"duration_ms":12,"transforms":["ANTHROPIC_API_KEY"],"dropped":3,` +
		`"method":"POST","path":"/v1/messages","status":201}`
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}

	// Optional fields are omitted; the counters and identity never are.
	got, err = json.Marshal(Record{Schema: Schema, Time: r.Time, Sandbox: "api", Proto: "udp", Dst: "192.0.2.1:443", Verdict: "deny"})
	if err != nil {
		t.Fatal(err)
	}
	want = `{"schema":1,"time":"2026-03-01T12:30:45.123456789Z","sandbox":"api","proto":"udp",` +
		`"dst":"192.0.2.1:443","verdict":"deny","bytes_up":0,"bytes_down":0,"duration_ms":0}`
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}

	var back Record
	if err := json.Unmarshal([]byte(`{"schema":1,"verdict":"allow","added_later":true}`), &back); err != nil {
		t.Fatalf("unknown fields must be ignored: %v", err)
	}
}

// TestEveryFieldTagged catches a field added without a frozen JSON name.
func TestEveryFieldTagged(t *testing.T) {
	for _, typ := range []reflect.Type{reflect.TypeFor[Record](), reflect.TypeFor[Entry]()} {
		for f := range typ.Fields() {
			tag := f.Tag.Get("json")
			name, _, _ := strings.Cut(tag, ",")
			if name == "" || name != strings.ToLower(name) {
				t.Errorf("%s.%s: json tag %q; want an explicit snake_case name", typ.Name(), f.Name, tag)
			}
		}
	}
}

func TestEntryJSONFrozen(t *testing.T) {
	when := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	e := Entry{Dest: "evil.example:443", Name: "evil.example", Ports: []uint16{443}, Count: 2,
		First: when, Last: when.Add(time.Second), Rule: "evil.example", Reason: "blocked", Proto: "tcp"}
	got, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"dest":"evil.example:443","name":"evil.example","ports":[443],"count":2,` +
		`"first":"2026-03-01T12:00:00Z","last":"2026-03-01T12:00:01Z","rule":"evil.example","reason":"blocked","proto":"tcp"}`
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// TestAddedFieldsFrozen pins the names added with aggregation, split
// connection records and drop notices.
func TestAddedFieldsFrozen(t *testing.T) {
	when := time.Date(2026, 3, 1, 12, 30, 45, 0, time.UTC)
	got, err := json.Marshal(Record{Schema: Schema, Time: when, Sandbox: "api", Proto: "udp", Dst: "192.0.2.1:443",
		Verdict: "deny", Count: 41, Last: when.Add(time.Second), Phase: PhaseEnd, Flow: "f-1",
		DroppedKinds: map[string]int64{"deny": 2, "allow": 1}})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"schema":1,"time":"2026-03-01T12:30:45Z","sandbox":"api","proto":"udp","dst":"192.0.2.1:443",` +
		`"verdict":"deny","bytes_up":0,"bytes_down":0,"duration_ms":0,"count":41,"last":"2026-03-01T12:30:46Z",` +
		`"phase":"end","flow":"f-1","dropped_kinds":{"allow":1,"deny":2}}`
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if PhaseStart != "start" || PhaseEnd != "end" {
		t.Fatal("phase values changed")
	}
}
