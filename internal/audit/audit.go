// Package audit is the gate's record of what it decided: one JSON line per
// connection, DNS query or ICMP echo, allowed or denied, so that a person can
// tell afterwards what the agent reached and what it was refused. It also
// keeps the denials ledger, the in-memory per-destination summary behind
// `moat network denials`.
//
// # Specification
//
// The audit log is two series of JSON Lines files (UTF-8, one object per
// line, "\n" after each), mode 0600, in the sandbox's state directory:
//
//   - audit.jsonl, the kept series: every allowed connection, request and
//     DNS answer, every record naming a secret the gate used (transforms),
//     the first denial of each distinct destination, the counts of
//     denials beyond the destinations tracked, and notices of what was
//     dropped.
//   - audit-noise.jsonl, the noise series: repeated identical denials
//     (same destination, request and reason) of an interval of 10 s: the
//     first 10 one by one, so that a few retries show at once, and the
//     rest as one aggregate with count at the interval's end; the same
//     for destinations beyond the tracked set.
//
// Each series is rotated on its own: when the next lines would take the
// file past a quarter of the series' budget it is renamed to .1, .1 to .2
// and so on up to .3. The noise series gets a quarter of the audit's size
// bound ([audit] max_size, 128 MiB unless configured) and drops its
// oldest file freely; the kept series gets the rest and drops a file only
// once its newest record is older than the retention ([audit] retention,
// 7 days unless configured). A file of either series older than the
// retention is deleted. When the kept series is full of records younger
// than the retention, the log reports failing (the gate then lets nothing
// through, as on a full disk) and the records that still come (ends of
// connections, denials) go to the noise series. The distinct denied
// destinations whose first denial is kept are at most 4096 within the
// retention (fewer under a small bound: their records take at most a
// quarter of the kept series); beyond them a destination's denials go to
// the noise series like repeats, and denials of more destinations than
// an interval has aggregates for (as many as are tracked) are one record
// with count in the kept series. Whatever rotation or retention deletes is
// itself recorded in the kept series: a "dropped" record with the count
// by kind (dropped_kinds).
//
// Readers merge the two series by time (Read). Records within a file are
// in the order the gate wrote them; that is close to, not exactly, time
// order, since decisions finish concurrently.
//
// A line is written whole or not at all: a write that fails (a full disk)
// is cut back to the last whole line, each file keeps a preallocated
// reserve so that the records of decisions already made still fit once the
// disk is full, and readers skip a last line without its "\n". Records
// that could not be written are counted (Log.Lost) and reported by a
// dropped record once writing works again.
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
//	                     inside a TLS connection the gate terminated; "mcp" for one
//	                     MCP call inside such a request (see below) (the
//	                     connection itself has its own "tcp" record); "" only
//	                     in a dropped record and in the count of denials beyond
//	                     the tracked set
//	dst          string  the address the guest addressed, ip:port ("gateway:53" for
//	                     DNS queries, a bare ip for ICMP); "" in a dropped record
//	                     and in the count of denials beyond the tracked set
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
//	reason       string  why, in words, above all for denials: "no rule allows it",
//	                     "blocked by rule", "refused address class: loopback",
//	                     "no SNI and no address rule allows 192.0.2.1", ... (the
//	                     Reason constants and functions). For people; scripts
//	                     should match verdict, rule and layer.
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
//	count        int     in an aggregate: how many identical denials (same proto, name
//	                     or address and port, method, path and reason) the record
//	                     stands for, from time to last, besides the first one, which
//	                     has a record of its own; omitted in a record that stands
//	                     for one
//	last         string  in an aggregate: when the last denial it counts was made
//	                     (RFC 3339, UTC); omitted otherwise
//	phase        string  for a TCP connection the gate carried: "start" when it was
//	                     decided and dialed (verdict, destination, rule, upstream;
//	                     bytes and duration 0), "end" when it ended (the same fields
//	                     with bytes and duration). Omitted in a record that is the
//	                     whole of its flow (a denial, a failed dial, a DNS query)
//	flow         string  links a "start" record to its "end": the same value in both,
//	                     unique within the sandbox's log; omitted with phase
//	dropped_kinds object in a dropped record written for rotation or retention:
//	                     the records deleted by kind: "allow" (allow and
//	                     would_deny), "secret" (with transforms), "deny",
//	                     "aggregate" (records with count), "lost" (records an
//	                     earlier dropped record said were never written), "other".
//	                     A dropped record deleted in turn passes its counts on to
//	                     the one that says so, so the newest add up to everything
//	rejected_by  string  in a denial, the step that refused it: one of the step
//	                     names below; omitted when the gate does not trace steps
//	                     (a sandbox's gate does not yet; the gate service does)
//	steps        [object] the checks that looked at the connection or request, in
//	                     order, each {"name", "action" ("allow" or "deny"),
//	                     "duration_us"}. Names: "source" (which tenant the client
//	                     is), "address_class", "peek" (reading the ClientHello or
//	                     request head), "policy", "inspection", "request_rules",
//	                     "secrets", "dial", "capacity", "audit". Omitted when not
//	                     traced
//	mcp_server   string  in an "mcp" record: the [mcp.NAME] server the call went to
//	mcp_method   string  the JSON-RPC method: "tools/call", "resources/read", ...
//	mcp_tool     string  the tool called (tools/call), at most 256 bytes
//	mcp_uri      string  the resource read (resources/*), at most 512 bytes
//	mcp_arguments string the call's arguments as JSON, scrubbed of secret values and
//	                     cut at 2 KiB; only when the server has audit_arguments = true
//	namespace    string  the gate service on Kubernetes ([kubernetes]): the sandbox's
//	                     namespace; sandbox is then the agent-sandbox Sandbox's name
//	sandbox_uid  string  that Sandbox's UID
//	pod          string  the sandbox's pod, which the client's address belonged to
//	pod_uid      string  that pod's UID
//	claim        string  the SandboxClaim that took the sandbox; omitted while it is
//	                     a warm pool's (unclaimed)
//	claim_uid    string  that claim's UID
//	template     string  the SandboxTemplate the sandbox was made from
//
// Proto "mcp" is one JSON-RPC call to a declared MCP server, read inside a
// request the gate terminated (a request that was carried has its own
// "http" record too): verdict, rule (the tools or resources pattern that
// decided, as written), reason, duration_ms (from the request to the end
// of its answer), and the fields above.
//
// A dropped record says that records were lost: verdict "dropped",
// dropped the count, proto and dst empty, reason why. The gate made
// decisions faster than the log could be written (the queue was full), the
// disk refused them, or rotation or retention deleted a file (then
// dropped_kinds says what was in it). Losing a record never delays or
// changes a decision; the gate never waits for the disk.
//
// A reader that does not know count, phase and flow still reads every
// record correctly as one decision; it counts an aggregate as one denial
// and a carried connection twice (its start and its end).
package audit

import "time"

// Schema is the version in every record's "schema" field (frozen).
const Schema = 1

// Verdict is a record's verdict. Its words are frozen (the audit's JSON).
type Verdict string

// Verdicts.
const (
	Allow   Verdict = "allow"
	Deny    Verdict = "deny"
	Dropped Verdict = "dropped" // the synthetic record that counts lost records
	// WouldDeny is a flow the policy denies that went through because the
	// sandbox runs in report mode.
	WouldDeny Verdict = "would_deny"
)

// NameSource is where the gate got a record's name (its name_from). Its
// words are frozen (the audit's JSON).
type NameSource string

// Name sources.
const (
	FromSNI  NameSource = "sni"  // the TLS ClientHello
	FromHost NameSource = "host" // the HTTP Host header
	FromDNS  NameSource = "dns"  // the DNS query itself
	// FromPool: the private pool address the name was answered with.
	FromPool NameSource = "pool"
	// FromObserved: an earlier answer the gate gave the guest.
	FromObserved NameSource = "observed"
	// FromResolved: pre-resolved from an allow rule.
	FromResolved NameSource = "resolved"
	// FromGranted: bound by an interactive grant.
	FromGranted NameSource = "granted"
)

// Record is one line of the audit log. The JSON names are frozen; see the
// package documentation for what each field means.
type Record struct {
	Schema     int        `json:"schema"`
	Time       time.Time  `json:"time"`
	Sandbox    string     `json:"sandbox"`
	Proto      string     `json:"proto"`
	Dst        string     `json:"dst"`
	Name       string     `json:"name,omitempty"`
	NameFrom   NameSource `json:"name_from,omitempty"`
	Verdict    Verdict    `json:"verdict"`
	Rule       string     `json:"rule,omitempty"`
	Layer      string     `json:"layer,omitempty"`
	Reason     Reason     `json:"reason,omitempty"`
	Upstream   string     `json:"upstream,omitempty"`
	BytesUp    int64      `json:"bytes_up"`
	BytesDown  int64      `json:"bytes_down"`
	DurationMS int64      `json:"duration_ms"`
	Transforms []string   `json:"transforms,omitempty"`
	Dropped    int64      `json:"dropped,omitempty"`
	Method     string     `json:"method,omitempty"`
	Path       string     `json:"path,omitempty"`
	Status     int        `json:"status,omitempty"`
	// Added with aggregation and split connection records; see the
	// package documentation.
	Count        int64            `json:"count,omitempty"`
	Last         time.Time        `json:"last,omitzero"`
	Phase        string           `json:"phase,omitempty"`
	Flow         string           `json:"flow,omitempty"`
	DroppedKinds map[string]int64 `json:"dropped_kinds,omitempty"`
	// Added with the gate service (moat gate serve); see the package
	// documentation.
	RejectedBy string `json:"rejected_by,omitempty"`
	Steps      []Step `json:"steps,omitempty"`
	// Added with MCP rules (proto "mcp"); see the package documentation.
	MCPServer    string `json:"mcp_server,omitempty"`
	MCPMethod    string `json:"mcp_method,omitempty"`
	MCPTool      string `json:"mcp_tool,omitempty"`
	MCPURI       string `json:"mcp_uri,omitempty"`
	MCPArguments string `json:"mcp_arguments,omitempty"`
	// Added with the gate service on Kubernetes; see the package
	// documentation.
	Namespace  string `json:"namespace,omitempty"`
	SandboxUID string `json:"sandbox_uid,omitempty"`
	Pod        string `json:"pod,omitempty"`
	PodUID     string `json:"pod_uid,omitempty"`
	Claim      string `json:"claim,omitempty"`
	ClaimUID   string `json:"claim_uid,omitempty"`
	Template   string `json:"template,omitempty"`
}

// Step is one check that looked at a connection or request, in a record's
// steps trace. Its JSON names are frozen.
type Step struct {
	Name       string `json:"name"`        // a Step* constant
	Action     string `json:"action"`      // "allow" or "deny"
	DurationUS int64  `json:"duration_us"` // how long the step took, in microseconds
}

// Step names (frozen: they are rejected_by's words too).
const (
	StepSource       = "source"        // which tenant the client's address belongs to (gate service)
	StepAddressClass = "address_class" // loopback, private, metadata, the host's own addresses
	StepPeek         = "peek"          // reading the ClientHello or request head
	StepPolicy       = "policy"        // the name's (or address's) rules
	StepInspection   = "inspection"    // whether the gate can read what the decision needs it to
	StepRequestRules = "request_rules" // method and path rules
	StepSecrets      = "secrets"       // placeholders swapped, require, secrets in the clear
	StepDial         = "dial"          // resolving and connecting to the upstream
	StepCapacity     = "capacity"      // connection and request limits
	StepAudit        = "audit"         // the audit log cannot be written
)

// Step actions.
const (
	StepAllow = "allow"
	StepDeny  = "deny"
)

// Phases of a carried TCP connection's records.
const (
	PhaseStart = "start"
	PhaseEnd   = "end"
)
