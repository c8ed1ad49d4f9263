package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/state"
	"moat.dev/moat/internal/watchtui"
)

func newWatchCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "watch [NAME] [--json]",
		Short: "Answer the gate's questions: hold undecided connections for you to allow or deny",
		Long: `While watch runs, a connection from a watched sandbox to a destination no rule
decides is held instead of refused, and shown here with the guest process that made
it. Answer with one key:

  o  allow once          r  allow for this run        a  always (written to a file)
  h  allow everything for one hour                    d  deny
  b  block the domain and its subdomains (written to a file)

"always" and "block" then ask for the file: p (the project's moat.toml) or u (your
config.toml). watch writes the rule into that file itself, then the sandbox applies it
at once; if the sandbox cannot (the connection was refused meanwhile, say), the rule
stays in the file and watch says how to apply it. An unanswered connection is refused
after 30 s. A block rule in a file is never asked about. Without NAME, every running
sandbox is watched, including those that start later. watch reconnects by itself when
a daemon restarts.

--json prints the event stream instead (one JSON object per line, the stable schema of
GET /v1/watch, each with its sandbox), for other front ends; answer with
POST /v1/holds/{id} on the sandbox's control socket. The daemon writes no file: a front
end answering always or block writes the rule into the file first and names it in
"written".`,
		Example: "  moat network watch\n  moat network watch api\n  moat network watch --json",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			only := ""
			if len(args) == 1 {
				if _, _, err := e.byName(args[0]); err != nil {
					return err
				}
				only = args[0]
			}
			if !asJSON && !term.IsTerminal(int(os.Stdout.Fd())) {
				return codef(ExitUsage, "moat network watch draws on a terminal; for an event stream other programs can read, use --json")
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			ws := &watchSet{e: e, only: only, running: map[string]bool{}}
			if asJSON {
				enc := json.NewEncoder(c.OutOrStdout())
				var mu sync.Mutex
				ws.send = func(msg tea.Msg) {
					if m, ok := msg.(watchtui.EventMsg); ok {
						m.Event.Sandbox = m.Sandbox
						mu.Lock()
						enc.Encode(m.Event)
						mu.Unlock()
					}
				}
				ws.run(ctx)
				return nil
			}
			p := tea.NewProgram(watchtui.New(ws.answer, time.Now), tea.WithContext(ctx))
			ws.send = p.Send
			go ws.run(ctx)
			_, err = p.Run()
			if errors.Is(err, tea.ErrProgramKilled) || ctx.Err() != nil {
				return nil
			}
			return err
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print the event stream as JSON lines instead of drawing (schema 1)")
	return c
}

// watchSet keeps one stream open per watched sandbox.
type watchSet struct {
	e    *env
	only string // one sandbox, or "" for every running one
	send func(tea.Msg)

	mu      sync.Mutex
	running map[string]bool // sandboxes with a stream goroutine
}

// rescanEvery is how often watch looks for sandboxes that started.
const rescanEvery = 2 * time.Second

func (ws *watchSet) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		names := []string{ws.only}
		if ws.only == "" {
			names = names[:0]
			if recs, err := state.List(ws.e.dirs); err == nil {
				for _, r := range recs {
					if sandboxAt(ws.e.dirs.Sandbox(r.Name)).alive() {
						names = append(names, r.Name)
					}
				}
			}
		}
		for _, n := range names {
			ws.mu.Lock()
			if !ws.running[n] {
				ws.running[n] = true
				wg.Add(1)
				go func() { defer wg.Done(); ws.stream(ctx, n) }()
			}
			ws.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(rescanEvery):
		}
	}
}

// stream keeps one sandbox's event stream open, reconnecting with a
// bounded backoff. Watching every sandbox, it stops once the sandbox is
// no longer running (the scan starts it again if it comes back).
func (ws *watchSet) stream(ctx context.Context, name string) {
	defer func() {
		ws.mu.Lock()
		delete(ws.running, name)
		ws.mu.Unlock()
	}()
	s := sandboxAt(ws.e.dirs.Sandbox(name))
	cl := s.client()
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := cl.Watch(ctx, func(ev control.Event) error {
			if ev.Type == control.EventHello {
				backoff = 100 * time.Millisecond
				ws.send(watchtui.ConnMsg{Sandbox: name, Connected: true})
			}
			ws.send(watchtui.EventMsg{Sandbox: name, Event: ev})
			return nil
		})
		if ctx.Err() != nil {
			return
		}
		ws.send(watchtui.ConnMsg{Sandbox: name, Connected: false, Err: err})
		if ws.only == "" && !s.alive() {
			ws.send(watchtui.GoneMsg{Sandbox: name})
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// answer answers hold h. An "always" or "block" answer is written here,
// by the person's own process, into the scope's config file, and only
// then sent to the daemon, which applies the same rule live: the daemon
// cannot write the person's configuration (control's package doc says
// why). In that order a failure leaves nothing that misleads: an error
// before the write sends nothing (the hold stays pending, to be answered
// again); a post that fails after it says the file holds the rule, the
// sandbox does not, and how to apply it now.
func (ws *watchSet) answer(h control.Hold, a control.Answer) (*control.AnswerResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cl := sandboxAt(ws.e.dirs.Sandbox(h.Sandbox)).client()
	list, entries, err := h.Rules(a.Answer)
	if err != nil {
		return nil, err
	}
	if list == "" {
		return cl.AnswerHold(ctx, h.ID, a)
	}
	file, err := ws.scopeFile(h.Sandbox, a.Scope)
	if err != nil {
		return nil, err
	}
	// The file is the person's, and so is this process: no daemon
	// privilege is involved in changing it.
	if _, err := config.AddRules(file, list, entries...); err != nil {
		return nil, err
	}
	a.Written = file
	res, err := cl.AnswerHold(ctx, h.ID, a)
	if err != nil {
		return nil, &notLiveError{sandbox: h.Sandbox, list: list, entries: entries, file: file, err: err}
	}
	res.File = file // this process wrote it; the daemon only echoes the name
	return res, nil
}

// scopeFile is the config file an "always" or "block" answer writes: the
// project's moat.toml at the sandbox's workspace root, or the user's
// config.toml. Both come from this process's own view of the user's
// files (the record the CLI made at create, its own config directory),
// never from the daemon, so a daemon cannot steer the write elsewhere.
func (ws *watchSet) scopeFile(sandbox, scope string) (string, error) {
	if scope == control.ScopeUser {
		if ws.e.dirs.Config != "" {
			return ws.e.dirs.UserConfig(), nil
		}
		return "", errors.New("this sandbox has no user config file to write; answer with scope project")
	}
	_, rec, err := ws.e.byName(sandbox)
	if err != nil {
		return "", err
	}
	if rec.Workspace == "" {
		return "", errors.New("this sandbox has no workspace to write moat.toml into; answer with scope user")
	}
	return filepath.Join(rec.Workspace, "moat.toml"), nil
}

// notLiveError is an "always" or "block" answer whose rule was written
// into its file but not taken live by the sandbox (the hold had ended,
// the daemon stopped or refused): the file is right, the running sandbox
// does not know.
type notLiveError struct {
	sandbox, list string
	entries       []string
	file          string
	err           error
}

func (e *notLiveError) Error() string {
	args := make([]string, len(e.entries))
	for i, en := range e.entries {
		args[i] = en
		if strings.Contains(en, "*") {
			args[i] = "'" + en + "'" // a shell would expand it
		}
	}
	return fmt.Sprintf("wrote %s to %s, but the sandbox did not take it live (%v); to apply it now: moat network %s %s %s",
		strings.Join(e.entries, ", "), e.file, e.err, e.list, e.sandbox, strings.Join(args, " "))
}

func (e *notLiveError) Unwrap() error { return e.err }
