package gate

import (
	"context"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"
)

// The interactive gate. Default deny is only livable if a person can say
// yes quickly: while at least one watcher is attached (moat network
// watch), a connection to a destination no rule decides is held instead
// of refused, and the watcher's answer lets it through or refuses it.
// With no watcher attached nothing is held, so the gate behaves exactly
// like plain default deny. A destination a rule blocks is never held: a
// block written in a file is an answer already.
//
// Holds coalesce per destination (name:port, or ip:port without a name):
// an agent that retries, or opens twenty connections at once, asks one
// question. At most HoldsOptions.Max (MaxHolds) destinations wait at once per sandbox;
// beyond that a connection is refused at once, so a guest cannot park
// thousands of goroutines on the daemon. A hold nobody answers is
// refused after the timeout.

// Hold defaults.
const (
	// MaxHolds bounds the destinations waiting for an answer at once,
	// unless HoldsOptions.Max says otherwise.
	MaxHolds = 16
	// DefaultHoldTimeout is how long a hold waits for an answer.
	DefaultHoldTimeout = 30 * time.Second
)

// Question is a held destination: what a watcher is asked about.
type Question struct {
	Name string // empty when the gate knows only the address
	Addr netip.Addr
	Port uint16
	// Src is the guest's end of the first connection held, by which the
	// daemon can ask the guest which process it is.
	Src netip.AddrPort
	// Kind is "" for a connection; KindSSHSign for a signature the guest
	// asks the forwarded ssh-agent for ([ssh_agent] confirm): Name then
	// names the key.
	Kind string
}

// KindSSHSign is the Kind of an ssh-agent signature question.
const KindSSHSign = "ssh-sign"

// KindMCPTool is the Kind of a call to an MCP server's tool that no
// pattern decides: Name is "SERVER TOOL" (mcpserve.go).
const KindMCPTool = "mcp-tool"

// Key is the destination the hold coalesces on.
func (q Question) Key() string {
	if q.Kind != "" {
		return q.Kind + " " + q.Name
	}
	if q.Name != "" {
		return q.Name + ":" + strconv.Itoa(int(q.Port))
	}
	return netip.AddrPortFrom(q.Addr, q.Port).String()
}

// Outcome is how a hold ended.
type Outcome struct {
	Allow bool
	// Answer is the watcher's answer, a control.Answer* word (once, run,
	// always, deny, block), when By is ByWatcher; AnswerHour when By is
	// ByRule; "" otherwise. The gate names it in the audit record and
	// decides nothing by it.
	Answer string
	By     EndedBy
}

// EndedBy says what ended a hold, or why a connection was not held. The
// words are the watch API's "by" (control.Event): frozen.
type EndedBy string

// What ends a hold.
const (
	ByWatcher  EndedBy = "watcher"  // a watcher answered (Outcome.Answer)
	ByTimeout  EndedBy = "timeout"  // nobody answered in time
	ByOverflow EndedBy = "overflow" // not held: Max destinations already wait
	ByClosed   EndedBy = "closed"   // every watcher left, or the connection gave up
	ByRule     EndedBy = "rule"     // not held: "allow everything for an hour" lasts
	ByNone     EndedBy = "none"     // not held: no watcher, plain default deny
)

// AnswerHour is the Answer of a connection let through while "allow
// everything for an hour" lasts: control.AnswerHour (the gate does not
// depend on the control API; a test holds the two equal).
const AnswerHour = "hour"

// Pending is a hold as watchers see it.
type Pending struct {
	ID      string
	Q       Question
	Since   time.Time
	Expires time.Time
	Count   int
	Process string // the guest process, once Annotate has found it
}

// HoldEvent is what Holds tells its subscribers: a new hold, a hold that
// another connection joined, or a hold that ended.
type HoldEvent struct {
	Kind    HoldEventKind
	Pending Pending
	Outcome Outcome // HoldResolved
}

// HoldEventKind is what a HoldEvent tells. The words are the watch API's
// event types (control.EventHold, EventHoldMore, EventResolved): frozen.
type HoldEventKind string

// Hold events.
const (
	HoldNew      HoldEventKind = "hold"     // a destination is held
	HoldJoined   HoldEventKind = "hold+"    // another connection joined it, or its process is known
	HoldResolved HoldEventKind = "resolved" // it ended (Outcome)
)

type hold struct {
	p    Pending
	done chan struct{}
	out  Outcome
	stop func() bool // cancels the timeout
}

// Holds is one sandbox's set of held destinations and its watchers. The
// zero value is not usable; call NewHolds.
type Holds struct {
	now     func() time.Time
	after   func(time.Duration, func()) func() bool
	timeout time.Duration
	max     int

	mu       sync.Mutex
	watchers int
	seq      int
	byKey    map[string]*hold
	byID     map[string]*hold
	taken    map[string]*hold // by Take, until Finish
	subs     map[int]func(HoldEvent)
	subSeq   int
	openTill time.Time // "allow everything for one hour"
}

// HoldsOptions configures NewHolds; zero values mean the defaults.
type HoldsOptions struct {
	Timeout time.Duration
	Now     func() time.Time
	// AfterFunc runs f after d and returns a function that cancels it,
	// reporting whether it did (time.AfterFunc's Stop). Tests replace it
	// to fire timeouts when they choose.
	AfterFunc func(d time.Duration, f func()) (stop func() bool)
	// Max bounds the destinations waiting at once; 0: MaxHolds.
	Max int
}

// NewHolds returns an empty set with no watchers.
func NewHolds(o HoldsOptions) *Holds {
	if o.Timeout <= 0 {
		o.Timeout = DefaultHoldTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.AfterFunc == nil {
		o.AfterFunc = func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }
	}
	if o.Max <= 0 {
		o.Max = MaxHolds
	}
	return &Holds{now: o.Now, after: o.AfterFunc, timeout: o.Timeout, max: o.Max,
		byKey: map[string]*hold{}, byID: map[string]*hold{}, taken: map[string]*hold{}, subs: map[int]func(HoldEvent){}}
}

// Max is how many destinations may wait at once.
func (h *Holds) Max() int { return h.max }

// Timeout is how long a hold waits for an answer.
func (h *Holds) Timeout() time.Duration { return h.timeout }

// Watch attaches a watcher: until the returned function is called,
// undecided destinations are held, and fn is told of every hold event.
// fn is called with Holds' lock held, so it must not block or call back
// into Holds; hand the event to a channel. The current holds are returned
// so a watcher that attaches late (or reattaches after a restart of its
// own) sees what is already waiting. When the last watcher leaves, every
// pending hold is refused: nobody is left to answer it.
func (h *Holds) Watch(fn func(HoldEvent)) (pending []Pending, detach func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.watchers++
	h.subSeq++
	id := h.subSeq
	if fn != nil {
		h.subs[id] = fn
	}
	pending = h.pendingLocked()
	var once sync.Once
	return pending, func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.watchers--
			delete(h.subs, id)
			if h.watchers == 0 {
				for _, x := range h.byID {
					h.finishLocked(x, Outcome{By: ByClosed})
				}
			}
		})
	}
}

// Pending is the holds waiting for an answer, oldest first.
func (h *Holds) Pending() []Pending {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.pendingLocked()
}

func (h *Holds) pendingLocked() []Pending {
	var out []Pending
	for _, x := range h.byID {
		out = append(out, x.p)
	}
	slices.SortFunc(out, func(a, b Pending) int { return a.Since.Compare(b.Since) })
	return out
}

// Watchers is the number of attached watchers.
func (h *Holds) Watchers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.watchers
}

// Subscribe tells fn of every hold event without attaching a watcher (for
// the daemon's own log). fn runs with Holds' lock held; see Watch.
func (h *Holds) Subscribe(fn func(HoldEvent)) (cancel func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.subSeq++
	id := h.subSeq
	h.subs[id] = fn
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.subs, id)
	}
}

// OpenUntil makes every undecided destination allowed until t (the "allow
// everything for one hour" answer); a zero t ends it.
func (h *Holds) OpenUntil(t time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.openTill = t
}

// Open reports whether undecided destinations are allowed right now.
func (h *Holds) Open() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.now().Before(h.openTill)
}

// Ask holds a connection to q until a watcher answers, the hold times
// out, every watcher leaves or ctx ends. Without a watcher it returns at
// once, refused (ByNone), which is plain default deny.
func (h *Holds) Ask(ctx context.Context, q Question) Outcome {
	h.mu.Lock()
	if q.Kind == "" && h.now().Before(h.openTill) {
		// "Everything for an hour" is about connections, not signatures.
		h.mu.Unlock()
		return Outcome{Allow: true, Answer: AnswerHour, By: ByRule}
	}
	if h.watchers == 0 {
		h.mu.Unlock()
		return Outcome{By: ByNone}
	}
	x, ok := h.byKey[q.Key()]
	switch {
	case ok:
		x.p.Count++
		h.emitLocked(HoldEvent{Kind: HoldJoined, Pending: x.p})
	case len(h.byKey) >= h.max:
		h.mu.Unlock()
		return Outcome{By: ByOverflow}
	default:
		h.seq++
		now := h.now()
		x = &hold{p: Pending{ID: "h" + strconv.Itoa(h.seq), Q: q, Since: now, Expires: now.Add(h.timeout), Count: 1},
			done: make(chan struct{})}
		h.byKey[q.Key()], h.byID[x.p.ID] = x, x
		id := x.p.ID
		x.stop = h.after(h.timeout, func() { h.expire(id) })
		h.emitLocked(HoldEvent{Kind: HoldNew, Pending: x.p})
	}
	h.mu.Unlock()
	select {
	case <-x.done:
		return x.out
	case <-ctx.Done():
		// This connection gave up (the daemon stops); the hold stays for
		// the others waiting on it.
		return Outcome{By: ByClosed}
	}
}

// Annotate records which guest process a pending hold's first connection
// came from, and tells the watchers (HoldJoined).
func (h *Holds) Annotate(id, process string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if x, ok := h.byID[id]; ok && process != "" {
		x.p.Process = process
		h.emitLocked(HoldEvent{Kind: HoldJoined, Pending: x.p})
	}
}

func (h *Holds) expire(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if x, ok := h.byID[id]; ok {
		h.finishLocked(x, Outcome{By: ByTimeout})
	}
}

// Take removes a pending hold so that nothing else (a timeout, another
// watcher) can end it, and returns it. The caller applies the answer's
// effects (a rule added, a file written) and then calls Finish, so the
// connections it releases already see the new rule. ok is false when the
// hold is no longer pending.
func (h *Holds) Take(id string) (p Pending, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	x, ok := h.byID[id]
	if !ok {
		return Pending{}, false
	}
	delete(h.byID, id)
	delete(h.byKey, x.p.Q.Key())
	if x.stop != nil {
		x.stop()
	}
	h.taken[id] = x
	return x.p, true
}

// Finish releases the connections of a hold taken with Take.
func (h *Holds) Finish(id string, out Outcome) {
	h.mu.Lock()
	defer h.mu.Unlock()
	x, ok := h.taken[id]
	if !ok {
		return
	}
	delete(h.taken, id)
	x.out = out
	close(x.done)
	h.emitLocked(HoldEvent{Kind: HoldResolved, Pending: x.p, Outcome: out})
}

func (h *Holds) finishLocked(x *hold, out Outcome) {
	delete(h.byID, x.p.ID)
	delete(h.byKey, x.p.Q.Key())
	if x.stop != nil {
		x.stop()
	}
	x.out = out
	close(x.done)
	h.emitLocked(HoldEvent{Kind: HoldResolved, Pending: x.p, Outcome: out})
}

func (h *Holds) emitLocked(e HoldEvent) {
	for _, fn := range h.subs {
		fn(e)
	}
}
