// Package watchtui is `moat network watch`: a terminal UI in which a person
// answers the interactive gate's questions. Default deny is only livable if
// saying yes is quick, so everything is one key: the held destinations of
// every watched sandbox are listed oldest first, with the guest process
// that asked and how long until the hold is refused, and a log of recent
// decisions shows what the gate did meanwhile.
//
// The model is pure (bubbletea's Elm-style Update and View): events from
// the daemons arrive as messages, answers leave as commands that call an
// injected function. The I/O — one control-API stream per sandbox, with
// reconnects — lives in the CLI.
package watchtui

import (
	"fmt"
	"slices"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"

	"moat.dev/moat/internal/control"
)

// AnswerFunc carries out an answer to hold h (h.Sandbox, h.ID): for
// "always" and "block" it writes the rule into the scope's file, then
// tells the sandbox's daemon.
type AnswerFunc func(h control.Hold, a control.Answer) (*control.AnswerResult, error)

// EventMsg is one event from a sandbox's /v1/watch stream.
type EventMsg struct {
	Sandbox string
	Event   control.Event
}

// ConnMsg says a sandbox's stream connected or dropped.
type ConnMsg struct {
	Sandbox   string
	Connected bool
	Err       error
}

// GoneMsg says a sandbox stopped: it is no longer watched.
type GoneMsg struct{ Sandbox string }

// answeredMsg is the daemon's reply to an answer.
type answeredMsg struct {
	hold   control.Hold
	answer string
	res    *control.AnswerResult
	err    error
}

// tickMsg redraws the waiting times.
type tickMsg time.Time

// maxLog is how many decisions the log keeps.
const maxLog = 200

type entry struct {
	hold  control.Hold
	stale bool // its sandbox's stream dropped: the hold may be gone
}

// Model is the watch screen.
type Model struct {
	answer AnswerFunc
	now    func() time.Time

	holds     []*entry // oldest first
	sel       int
	scopeFor  string // "always" or "block" while asking for the scope
	conns     map[string]bool
	log       []string
	status    string
	width     int
	height    int
	quitting  bool
	tickEvery time.Duration
}

// New returns an empty model; now is the clock (time.Now in use).
func New(answer AnswerFunc, now func() time.Time) Model {
	return Model{answer: answer, now: now, conns: map[string]bool{}, tickEvery: time.Second}
}

// Init starts the clock that redraws waiting times.
func (m Model) Init() tea.Cmd { return m.tick() }

func (m Model) tick() tea.Cmd {
	return tea.Tick(m.tickEvery, func(t time.Time) tea.Msg { return tickMsg(t) })
}

// Update applies one message.
func (m Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tickMsg:
		return m, m.tick()
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
	case ConnMsg:
		m.conns[msg.Sandbox] = msg.Connected
		for _, e := range m.holds {
			if e.hold.Sandbox == msg.Sandbox {
				e.stale = !msg.Connected
			}
		}
		if msg.Connected {
			// The stream starts again with every pending hold: what is
			// not sent again is gone.
			m.holds = slices.DeleteFunc(m.holds, func(e *entry) bool { return e.hold.Sandbox == msg.Sandbox })
			m.clampSel()
		}
	case GoneMsg:
		delete(m.conns, msg.Sandbox)
		m.holds = slices.DeleteFunc(m.holds, func(e *entry) bool { return e.hold.Sandbox == msg.Sandbox })
		m.clampSel()
	case EventMsg:
		m.event(msg)
	case answeredMsg:
		switch {
		case msg.err != nil:
			m.status = fmt.Sprintf("%s %s: %v", msg.answer, dest(msg.hold), msg.err)
		case msg.res != nil && msg.res.File != "":
			m.status = fmt.Sprintf("%s %s: wrote %s to %s", msg.answer, dest(msg.hold), msg.res.Rule, msg.res.File)
		case msg.res != nil && msg.res.Rule != "":
			m.status = fmt.Sprintf("%s %s: added %s for this run", msg.answer, dest(msg.hold), msg.res.Rule)
		default:
			m.status = fmt.Sprintf("%s %s", msg.answer, dest(msg.hold))
		}
	case tea.KeyPressMsg:
		return m.key(msg.String())
	}
	return m, nil
}

func (m *Model) event(msg EventMsg) {
	ev := msg.Event
	switch ev.Type {
	case control.EventHello:
		m.conns[msg.Sandbox] = true
	case control.EventHold, control.EventHoldMore:
		if ev.Hold == nil {
			return
		}
		h := *ev.Hold
		if h.Sandbox == "" {
			h.Sandbox = msg.Sandbox
		}
		for _, e := range m.holds {
			if e.hold.Sandbox == h.Sandbox && e.hold.ID == h.ID {
				e.hold, e.stale = h, false
				return
			}
		}
		m.holds = append(m.holds, &entry{hold: h})
		slices.SortStableFunc(m.holds, func(a, b *entry) int { return a.hold.Since.Compare(b.hold.Since) })
	case control.EventResolved:
		if ev.Hold == nil {
			return
		}
		m.holds = slices.DeleteFunc(m.holds, func(e *entry) bool {
			return e.hold.Sandbox == msg.Sandbox && e.hold.ID == ev.Hold.ID
		})
		m.clampSel()
		m.addLog(fmt.Sprintf("%s  %-8s %s %s (%s)", m.clock(ev.Time), msg.Sandbox, resolvedWord(ev), dest(*ev.Hold), ev.By))
	case control.EventDecision:
		if r := ev.Record; r != nil {
			name := r.Name
			if name == "" {
				name = r.Dst
			} else if _, port, ok := strings.Cut(r.Dst, ":"); ok && r.Proto != "dns" {
				name += ":" + port
			}
			why := r.Rule
			if why == "" {
				why = string(r.Reason)
			}
			m.addLog(fmt.Sprintf("%s  %-8s %-10s %-4s %s  %s", m.clock(r.Time), msg.Sandbox, r.Verdict, r.Proto, name, why))
		}
	}
}

func resolvedWord(ev control.Event) string {
	switch {
	case ev.Answer != "":
		return "answered " + ev.Answer + ":"
	case ev.By == "timeout":
		return "refused, no answer:"
	}
	return "refused:"
}

func (m *Model) addLog(s string) {
	m.log = append(m.log, s)
	if len(m.log) > maxLog {
		m.log = m.log[len(m.log)-maxLog:]
	}
}

func (m *Model) clampSel() {
	if m.sel >= len(m.holds) {
		m.sel = len(m.holds) - 1
	}
	if m.sel < 0 {
		m.sel = 0
	}
}

func (m Model) clock(t time.Time) string {
	if t.IsZero() {
		t = m.now()
	}
	return t.Local().Format("15:04:05")
}

// Keys: one key per answer.
var answerKeys = map[string]string{
	"o": control.AnswerOnce,
	"r": control.AnswerRun,
	"a": control.AnswerAlways,
	"h": control.AnswerHour,
	"d": control.AnswerDeny,
	"b": control.AnswerBlock,
}

func (m Model) key(k string) (tea.Model, tea.Cmd) {
	if m.scopeFor != "" {
		answer := m.scopeFor
		m.scopeFor = ""
		switch k {
		case "p":
			return m.send(answer, control.ScopeProject)
		case "u":
			return m.send(answer, control.ScopeUser)
		}
		m.status = "cancelled"
		return m, nil
	}
	switch k {
	case "ctrl+c", "q":
		m.quitting = true
		return m, tea.Quit
	case "up", "k":
		if m.sel > 0 {
			m.sel--
		}
	case "down", "j":
		if m.sel < len(m.holds)-1 {
			m.sel++
		}
	default:
		a, ok := answerKeys[k]
		if !ok || len(m.holds) == 0 {
			return m, nil
		}
		if a == control.AnswerAlways || a == control.AnswerBlock {
			m.scopeFor = a
			what := "allow " + m.holds[m.sel].hold.Suggest
			if a == control.AnswerBlock {
				what = "block " + m.holds[m.sel].hold.Domain
			}
			m.status = what + " in: p = the project's moat.toml, u = your config.toml (any other key cancels)"
			return m, nil
		}
		return m.send(a, "")
	}
	return m, nil
}

// send answers the selected hold.
func (m Model) send(answer, scope string) (tea.Model, tea.Cmd) {
	if len(m.holds) == 0 {
		return m, nil
	}
	h := m.holds[m.sel].hold
	m.status = fmt.Sprintf("%s %s…", answer, dest(h))
	fn := m.answer
	return m, func() tea.Msg {
		res, err := fn(h, control.Answer{Answer: answer, Scope: scope})
		return answeredMsg{hold: h, answer: answer, res: res, err: err}
	}
}

func dest(h control.Hold) string {
	if h.Kind != "" {
		return "ssh-agent: " + h.Name
	}
	if h.Name != "" {
		return fmt.Sprintf("%s:%d", h.Name, h.Port)
	}
	return fmt.Sprintf("%s:%d", h.Addr, h.Port)
}

// View draws the screen, on the alternate screen so the terminal comes
// back as it was.
func (m Model) View() tea.View {
	v := tea.NewView(m.screen())
	v.AltScreen = true
	return v
}

// screen is the text of the view.
func (m Model) screen() string {
	if m.quitting {
		return ""
	}
	var b strings.Builder
	var up, down []string
	for s, ok := range m.conns {
		if ok {
			up = append(up, s)
		} else {
			down = append(down, s)
		}
	}
	slices.Sort(up)
	slices.Sort(down)
	fmt.Fprintf(&b, "moat network watch: %d sandbox(es) watched", len(up))
	if len(up) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(up, ", "))
	}
	if len(down) > 0 {
		fmt.Fprintf(&b, "; reconnecting to %s", strings.Join(down, ", "))
	}
	b.WriteString("\n\n")
	if len(m.holds) == 0 {
		b.WriteString("  no connection is waiting for an answer\n")
	} else {
		fmt.Fprintf(&b, "  %-12s %-36s %-7s %-6s %-5s %s\n", "SANDBOX", "DESTINATION", "WAITED", "LEFT", "CONNS", "PROCESS")
		now := m.now()
		for i, e := range m.holds {
			mark := " "
			if i == m.sel {
				mark = ">"
			}
			left := e.hold.Expires.Sub(now).Round(time.Second)
			if left < 0 {
				left = 0
			}
			proc := e.hold.Process
			if e.stale {
				proc = "(disconnected; may be gone) " + proc
			}
			fmt.Fprintf(&b, "%s %-12s %-36s %-7s %-6s %-5d %s\n", mark, clip(e.hold.Sandbox, 12), clip(dest(e.hold), 36),
				now.Sub(e.hold.Since).Round(time.Second), left, e.hold.Count, clip(proc, 60))
		}
	}
	b.WriteString("\n  o once   r this run   a always   h everything for 1h   d deny   b block domain   j/k move   q quit\n")
	if m.status != "" {
		fmt.Fprintf(&b, "  %s\n", m.status)
	}
	b.WriteString("\nrecent decisions:\n")
	n := 10
	if m.height > 0 {
		n = max(3, m.height-len(m.holds)-12)
	}
	start := max(0, len(m.log)-n)
	for _, l := range m.log[start:] {
		w := m.width
		if w == 0 {
			w = 120
		}
		b.WriteString("  " + clip(l, max(40, w-4)) + "\n")
	}
	return b.String()
}

func clip(s string, n int) string {
	if n <= 0 || len([]rune(s)) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}
