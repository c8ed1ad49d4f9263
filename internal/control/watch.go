package control

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/policy"
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
//	                            applied (rules added, held connections released);
//	                            404 if the hold is no longer pending (answered
//	                            elsewhere or timed out); 400 for an unknown answer
//	                            or scope, and for an always or block answer without
//	                            Written (the hold stays pending).
//
// The daemon writes no file. An always or block answer is two steps, taken
// by the front end in this order: it writes the rule (Hold.Rules) into
// the scope's config file itself, then posts the answer naming that file
// in Written, and the daemon adds the same rule as a runtime rule of the
// sandbox (live at once, kept across down/up). The daemon's gate reads
// what the guest sends, so it must not be able to write a person's
// configuration; the front end runs as that person, who owns the files.
// Writing first means a failed post leaves a rule in the file that the
// front end can report, never a live rule the file does not hold. A request
// without Written (a front end that expects the daemon to write) is refused
// rather than half-applied, so no front end tells its user a file was
// written when none was.

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
	AnswerAlways = "always" // an allow rule, written into Scope's config file by the front end, and applied now
	AnswerHour   = "hour"   // allow every undecided destination for one hour
	AnswerDeny   = "deny"   // refuse the held connections; decide nothing else
	AnswerBlock  = "block"  // a block of the registrable domain and its subdomains, written like always
)

// Scopes: the file an "always" or "block" answer is written into (by the
// front end: see the package doc).
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
	// Written is the absolute path of the config file the caller already
	// wrote the answer's rule into (always, block); required for those.
	// The daemon does not open it: it reports it back in AnswerResult.File.
	Written string `json:"written,omitempty"`
}

// AnswerResult says what an answer did.
type AnswerResult struct {
	Schema int    `json:"schema"`
	Rule   string `json:"rule,omitempty"` // the rule added, if any
	File   string `json:"file,omitempty"` // the file written (by the caller: Answer.Written), if any
}

// ErrSignAnswer: a signature question (Hold.Kind "ssh-sign") takes only
// once, run or deny.
var ErrSignAnswer = errors.New("a signature is answered with once, run or deny")

// ErrBlockNoName: a destination known only by its address has no domain
// to block.
var ErrBlockNoName = errors.New("block needs a name, and this destination has only an address; use deny, or moat network block")

// Rules is what an answer to h writes into a config file: the list
// ("allow" or "block") and its entries, Suggest for always, Domain and
// its subdomains for block. Other answers write nothing (list ""). The
// daemon applies the same rule at runtime, so both sides derive it here.
// Each entry is checked as moat would read it back, so a file is never
// given a rule that breaks it.
func (h Hold) Rules(answer string) (list string, entries []string, err error) {
	if answer != AnswerAlways && answer != AnswerBlock {
		return "", nil, nil
	}
	if h.Kind != "" {
		return "", nil, ErrSignAnswer
	}
	list, entries = "allow", []string{h.Suggest}
	if answer == AnswerBlock {
		if h.Name == "" || h.Domain == "" {
			return "", nil, ErrBlockNoName
		}
		list, entries = "block", []string{h.Domain, "*." + h.Domain}
	}
	for _, e := range entries {
		if _, err := policy.ParseEntry(e); err != nil {
			return "", nil, fmt.Errorf("%q is not a rule moat can write: %w", e, err)
		}
	}
	return list, entries, nil
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
		return errorOf("daemon /v1/watch", resp)
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
