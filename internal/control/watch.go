package control

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"moat.dev/moat/internal/audit"
)

// Interactive gate endpoints (schema 1, fields only ever added). Any front
// end can decide holds with these two; `moat network watch` is one.
//
//	GET  /v1/watch              200, Content-Type application/x-ndjson: one Event
//	                            per line for as long as the request stays open.
//	                            While at least one such request is open the
//	                            sandbox has a watcher, and a connection to an
//	                            undecided destination is held instead of refused.
//	                            The stream opens with a "hello" event, then a
//	                            "hold" event for every hold already pending.
//	                            A "ping" event is sent every 10 s of silence.
//	POST /v1/holds/{id}         body Answer; 200 AnswerResult once the answer is
//	                            applied (rules added, files written); 404 if the
//	                            hold is no longer pending (answered elsewhere or
//	                            timed out); 400 for an unknown answer or scope.

// Event types.
const (
	EventHello    = "hello"    // first event: Sandbox, Timeout
	EventHold     = "hold"     // a new hold, or one already pending at connect
	EventHoldMore = "hold+"    // another connection joined a pending hold (Hold.Count grew)
	EventResolved = "resolved" // a hold ended: Hold.ID, Answer, By
	EventDecision = "decision" // an audit record the gate wrote (every decision)
	EventPing     = "ping"     // keep-alive
)

// Answers to a hold.
const (
	AnswerOnce   = "once"   // let the held connections through; decide nothing else
	AnswerRun    = "run"    // allow name:port until the sandbox stops (runtime grant, not persisted)
	AnswerAlways = "always" // write an allow rule into Scope's config file, and apply it now
	AnswerHour   = "hour"   // allow every undecided destination for one hour
	AnswerDeny   = "deny"   // refuse the held connections; decide nothing else
	AnswerBlock  = "block"  // write a block of the registrable domain and its subdomains into Scope's file
)

// Scopes: the file an "always" or "block" answer is written into.
const (
	ScopeProject = "project" // the project's moat.toml
	ScopeUser    = "user"    // the user's config.toml
)

// Hold is one pending destination. Many connections to one destination
// share a hold (Count).
type Hold struct {
	ID      string    `json:"id"`
	Sandbox string    `json:"sandbox"`
	Name    string    `json:"name,omitempty"` // empty when only an address is known
	Addr    string    `json:"addr"`           // ip the guest dialed
	Port    uint16    `json:"port"`
	Proto   string    `json:"proto"`             // tcp
	Process string    `json:"process,omitempty"` // the guest process, when known
	Since   time.Time `json:"since"`
	Count   int       `json:"count"`   // connections waiting on it
	Expires time.Time `json:"expires"` // refused at this time without an answer
	// Suggest is the rule an "always" answer writes; Domain is what a
	// "block" answer blocks (the registrable domain).
	Suggest string `json:"suggest"`
	Domain  string `json:"domain,omitempty"`
	// Kind is empty for a connection; "ssh-sign" for a signature the guest
	// asks the forwarded ssh-agent for ([ssh_agent] confirm = true), where
	// Name names the key and only once, run and deny are answers.
	Kind string `json:"kind,omitempty"`
}

// Event is one line of the /v1/watch stream.
type Event struct {
	Schema  int           `json:"schema"`
	Type    string        `json:"type"`
	Sandbox string        `json:"sandbox"`
	Time    time.Time     `json:"time"`
	Timeout time.Duration `json:"timeout_ns,omitempty"` // hello: how long a hold waits
	Hold    *Hold         `json:"hold,omitempty"`
	Answer  string        `json:"answer,omitempty"` // resolved
	By      string        `json:"by,omitempty"`     // resolved: watcher | timeout | rule
	Record  *audit.Record `json:"record,omitempty"` // decision
}

// Answer is the body of POST /v1/holds/{id}.
type Answer struct {
	Schema int    `json:"schema"`
	Answer string `json:"answer"`
	Scope  string `json:"scope,omitempty"` // always, block: project (default) | user
}

// AnswerResult says what an answer did.
type AnswerResult struct {
	Schema int    `json:"schema"`
	Rule   string `json:"rule,omitempty"` // the rule added, if any
	File   string `json:"file,omitempty"` // the file written, if any
}

// Watch streams the daemon's events into fn until ctx is done, the
// daemon closes the stream, or fn returns an error. It returns nil only
// when ctx ended.
func (c *Client) Watch(ctx context.Context, fn func(Event) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://moat/v1/watch", nil)
	if err != nil {
		return err
	}
	// The shared client's timeout would end the stream; this one lives
	// as long as ctx.
	hc := &http.Client{Transport: c.http.Transport}
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("calling daemon /v1/watch: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e ErrorBody
		json.NewDecoder(resp.Body).Decode(&e)
		return fmt.Errorf("daemon /v1/watch: %s", e.Error)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("reading /v1/watch: %w", err)
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading /v1/watch: %w", err)
	}
	return fmt.Errorf("daemon closed /v1/watch")
}

// AnswerHold answers a pending hold.
func (c *Client) AnswerHold(ctx context.Context, id string, a Answer) (*AnswerResult, error) {
	a.Schema = Schema
	var r AnswerResult
	if err := c.do(ctx, http.MethodPost, "/v1/holds/"+id, a, &r); err != nil {
		return nil, err
	}
	return &r, nil
}
