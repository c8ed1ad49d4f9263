package cli

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/spf13/cobra"
	"golang.org/x/term"

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
config.toml). An unanswered connection is refused after 30 s. A block rule in a file is
never asked about. Without NAME, every running sandbox is watched, including those that
start later. watch reconnects by itself when a daemon restarts.

--json prints the event stream instead (one JSON object per line, the stable schema of
GET /v1/watch, each with its sandbox), for other front ends; answer with
POST /v1/holds/{id} on the sandbox's control socket.`,
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
					if state.DaemonAlive(ws.e.dirs.Sandbox(r.Name)) {
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
	dir := ws.e.dirs.Sandbox(name)
	cl := control.At(dir)
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
		if ws.only == "" && !state.DaemonAlive(dir) {
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

// answer sends an answer to the sandbox's daemon.
func (ws *watchSet) answer(sandbox, id string, a control.Answer) (*control.AnswerResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return control.At(ws.e.dirs.Sandbox(sandbox)).AnswerHold(ctx, id, a)
}
