// Package audit is the gate's record of what it decided: one JSON line per
// connection, DNS query or ICMP echo, allowed or denied, so that a person can
// tell afterwards what the agent reached and what it was refused. It also
// keeps the denials ledger, the in-memory per-destination summary behind
// `moat network denials`.
//
// # Specification
//
// The audit log is a file of JSON Lines (UTF-8, one object per line, "\n"
// after each), audit.jsonl in the sandbox's state directory, mode 0600. When
// the next line would take it past its size limit (16 MiB unless configured)
// it is renamed to audit.jsonl.1, audit.jsonl.1 to audit.jsonl.2 and so on;
// the oldest beyond the kept count (3 unless configured) is deleted. Records
// within a file are in the order the gate wrote them; that is close to, not
// exactly, time order, since decisions finish concurrently.
//
// Every line is one Record. Field names and meanings are frozen: old logs
// must stay readable by new moat and scripts written against them must keep
// working. Fields are only ever added, and readers must ignore fields they do
// not know. Schema changes only if a field's meaning has to change.
//
//	schema       int     always 1 (Schema)
//	time         string  RFC 3339 in UTC with sub-second digits: when the
//	                     decision was made (for connections, when they began)
//	sandbox      string  the sandbox's name
//	proto        string  "tcp", "udp", "dns" or "icmp"; "http" for one request
//	                     inside a TLS connection the gate terminated (the
//	                     connection itself has its own "tcp" record); "" only
//	                     in a dropped record
//	dst          string  the address the guest addressed, ip:port ("gateway:53" for
//	                     DNS queries, a bare ip for ICMP)
//	name         string  the destination's name, when the gate knows one (omitted if not)
//	name_from    string  where the name came from: "sni" (TLS ClientHello), "host"
//	                     (HTTP Host), "dns" (the query itself), "pool" (the private
//	                     pool address it was answered with), "observed" (an earlier
//	                     answer to the guest), "resolved" (pre-resolved from an allow
//	                     rule), "granted" (an interactive grant)
//	verdict      string  "allow" or "deny"; "would_deny" for what report mode let
//	                     through; "dropped" in a dropped record
//	rule         string  the rule that decided, as written (omitted when none did)
//	layer        string  the layer the rule came from: "builtin", "policy" (named
//	                     policies), "user", "project", "runtime" (omitted when no
//	                     rule decided); the words are policy.Layer's; "interactive"
//	                     when a watcher's answer that adds no rule let it through
//	                     (rule "once" or "hour")
//	reason       string  why, in words, above all for denials: "no rule", "blocked",
//	                     "private address (loopback)", "no SNI", ... Free text for
//	                     people; scripts should match verdict, rule and layer.
//	upstream     string  the address actually dialed, ip:port (omitted if none was)
//	bytes_up     int     bytes from the guest to the upstream
//	bytes_down   int     bytes from the upstream to the guest
//	duration_ms  int     how long the connection lasted, in milliseconds
//	transforms   [string] what the gate changed in the traffic, by name: the names of
//	                     the secrets it swapped in, never their values (omitted if none)
//	dropped      int     in a dropped record only: how many records were lost
//	method       string  the HTTP request's method, when the gate read the request
//	                     (plain HTTP, or a request inside a terminated TLS
//	                     connection); omitted otherwise
//	path         string  that request's path, without its query string (queries
//	                     carry tokens), at most 512 bytes; omitted with method
//	status       int     the HTTP status the guest was answered with, in "http"
//	                     records (omitted when no answer was sent)
//
// A dropped record says that the gate made decisions faster than the log
// could be written and that some records were lost: verdict "dropped",
// dropped the count, proto and dst empty. Losing a record never delays or
// changes a decision; the gate never waits for the disk.
package audit

import "time"

// Schema is the version in every record's "schema" field (frozen).
const Schema = 1

// Verdicts.
const (
	Allow   = "allow"
	Deny    = "deny"
	Dropped = "dropped" // the synthetic record that counts lost records
	// WouldDeny is a flow the policy denies that went through because the
	// sandbox runs in report mode.
	WouldDeny = "would_deny"
)

// Record is one line of the audit log. The JSON names are frozen; see the
// package documentation for what each field means.
type Record struct {
	Schema     int       `json:"schema"`
	Time       time.Time `json:"time"`
	Sandbox    string    `json:"sandbox"`
	Proto      string    `json:"proto"`
	Dst        string    `json:"dst"`
	Name       string    `json:"name,omitempty"`
	NameFrom   string    `json:"name_from,omitempty"`
	Verdict    string    `json:"verdict"`
	Rule       string    `json:"rule,omitempty"`
	Layer      string    `json:"layer,omitempty"`
	Reason     string    `json:"reason,omitempty"`
	Upstream   string    `json:"upstream,omitempty"`
	BytesUp    int64     `json:"bytes_up"`
	BytesDown  int64     `json:"bytes_down"`
	DurationMS int64     `json:"duration_ms"`
	Transforms []string  `json:"transforms,omitempty"`
	Dropped    int64     `json:"dropped,omitempty"`
	Method     string    `json:"method,omitempty"`
	Path       string    `json:"path,omitempty"`
	Status     int       `json:"status,omitempty"`
}
