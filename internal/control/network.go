package control

import (
	"context"
	"net/http"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/policy"
)

// Network endpoints (schema 1, fields only ever added):
//
//	GET  /v1/network/rules     200 Rules: every rule in force, lowest layer first
//	POST /v1/network/rules     body RuleChange; applies it live, persists it with the
//	                           sandbox (runtime layer) and answers 200 Rules; 400 for a
//	                           bad entry, naming it
//	GET  /v1/network/denials   200 Denials: the ledger of denied destinations since start

// Rule is one network rule and where it comes from.
type Rule struct {
	Entry  string `json:"entry"`
	Action string `json:"action"` // allow | block
	Layer  string `json:"layer"`  // builtin | policy | user | project | runtime
	Source string `json:"source"` // file, policy name or "runtime"
}

// RulesOf converts compiled rules to their wire form.
func RulesOf(rs []policy.Rule) []Rule {
	out := []Rule{}
	for _, r := range rs {
		out = append(out, Rule{Entry: r.Entry, Action: r.Action.String(), Layer: r.Layer.String(), Source: r.Source})
	}
	return out
}

// Rules is GET /v1/network/rules.
type Rules struct {
	Schema int    `json:"schema"`
	Rules  []Rule `json:"rules"`
}

// RuleChange is the body of POST /v1/network/rules.
type RuleChange struct {
	Schema  int      `json:"schema"`
	Op      string   `json:"op"` // allow | block | remove
	Entries []string `json:"entries"`
}

// Denials is GET /v1/network/denials.
type Denials struct {
	Schema  int           `json:"schema"`
	Total   int64         `json:"total"`
	Entries []audit.Entry `json:"entries"`
}

// Rules asks for the rules in force.
func (c *Client) Rules(ctx context.Context) (*Rules, error) {
	var r Rules
	if err := c.do(ctx, http.MethodGet, "/v1/network/rules", nil, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// ChangeRules applies a runtime rule change.
func (c *Client) ChangeRules(ctx context.Context, ch RuleChange) (*Rules, error) {
	ch.Schema = Schema
	var r Rules
	if err := c.do(ctx, http.MethodPost, "/v1/network/rules", ch, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Denials asks for the denials ledger.
func (c *Client) Denials(ctx context.Context) (*Denials, error) {
	var d Denials
	if err := c.do(ctx, http.MethodGet, "/v1/network/denials", nil, &d); err != nil {
		return nil, err
	}
	return &d, nil
}
