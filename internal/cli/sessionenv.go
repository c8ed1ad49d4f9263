package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/preset"
	"moat.dev/moat/internal/state"
)

// configEnv expands the sandbox's [env] entries with the host's
// environment as it is now: values are read at each session start and go
// only into that session's environment, never to disk. A ${VAR:?message}
// whose VAR is unset refuses with the message.
func configEnv(cfg config.Config, lookup func(string) (string, bool)) (map[string]string, error) {
	out := map[string]string{}
	for _, e := range cfg.EnvVars {
		if e.Pass {
			if v, ok := lookup(e.Name); ok {
				out[e.Name] = v
			}
			continue
		}
		v, err := config.ExpandEnv(e.Value, lookup)
		if err != nil {
			return nil, codef(ExitUsage, "[env] %s: %v", e.Name, err)
		}
		out[e.Name] = v
	}
	return out, nil
}

// withConfigEnv adds the sandbox's [env] to a session's environment. The
// declared names win over anything moat itself sets (placeholders, a
// preset's variables): the user said so.
func withConfigEnv(rec *state.Record, sessEnv map[string]string) (map[string]string, error) {
	sessEnv = withPresetEnv(rec, sessEnv)
	cfg, err := rec.Snapshot()
	if err != nil {
		return nil, err
	}
	sessEnv = withMCPEnv(cfg, sessEnv)
	if len(cfg.EnvVars) == 0 {
		return sessEnv, nil
	}
	env, err := configEnv(cfg, os.LookupEnv)
	if err != nil {
		return nil, err
	}
	if sessEnv == nil {
		sessEnv = map[string]string{}
	}
	for k, v := range env {
		sessEnv[k] = v
	}
	return sessEnv, nil
}

// withPresetEnv adds, to every session of a sandbox that has used a
// preset, the preset's variables (its agent's non-essential traffic off)
// and its key aliases: `moat shell` and then `claude` must run as quiet as
// `moat run claude`. What the session already has wins.
func withPresetEnv(rec *state.Record, sessEnv map[string]string) map[string]string {
	for _, name := range rec.Presets {
		p, err := preset.Lookup(name)
		if err != nil {
			continue // a preset this moat no longer knows
		}
		if sessEnv == nil && (len(p.Env) > 0 || len(p.Aliases) > 0) {
			sessEnv = map[string]string{}
		}
		for k, v := range p.Env {
			if _, ok := sessEnv[k]; !ok {
				sessEnv[k] = v
			}
		}
		for alias, from := range p.Aliases {
			if _, ok := sessEnv[alias]; ok {
				continue
			}
			if _, ok := rec.Placeholders[alias]; ok {
				continue // a secret of its own
			}
			if v, ok := rec.Placeholders[from]; ok {
				sessEnv[alias] = v
			}
		}
	}
	return sessEnv
}

// connect starts the sandbox if need be and connects to its agent. A
// command that races an idle stop (the daemon refuses new sessions once it
// has decided to stop, or is gone by the time we dial) waits for the stop
// to finish and starts the sandbox again: it gets a started sandbox, never
// an error.
func (e *env) connect(ctx context.Context, dir string) (*ssh.Client, error) {
	if rec, err := state.Load(dir); err == nil && rec.Runtime == runtimeDocker {
		return e.dockerConnect(ctx, dir, rec)
	}
	s := sandboxAt(dir)
	for attempt := 0; ; attempt++ {
		c, err := e.startSession(dir, true)
		if err != nil {
			return nil, err
		}
		if c != nil {
			return c, nil
		}
		c, err = sshClient(ctx, dir)
		if err == nil {
			return c, nil
		}
		if attempt > 0 || (!control.IsStopping(err) && s.alive()) {
			return nil, err
		}
		// The daemon is stopping: wait until it is gone (bounded), then
		// start afresh.
		deadline := time.Now().Add(90 * time.Second)
		for s.alive() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// reconfigure replaces the sandbox's configuration snapshot with what its
// files say now (after consent, as at create) and, if it runs, restarts
// it so the new configuration applies. The writable layer is kept. The
// image cannot change this way: a new image is a new sandbox.
func (e *env) reconfigure(dir string, rec *state.Record) error {
	cfg, err := config.Load(e.dirs.UserConfig(), filepath.Join(rec.Workspace, "moat.toml"))
	if err != nil {
		return withCode(ExitUsage, err)
	}
	if img := imageName(cfg.Sandbox.Image); img != rec.Image {
		return codef(ExitUsage, "the image changed from %s to %s; an image is chosen when a sandbox is made: moat destroy %s, then moat up", rec.Image, img, rec.Name)
	}
	snap, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	if bytes.Equal(snap, rec.Config) {
		fmt.Fprintf(os.Stderr, "moat: %s: the configuration has not changed\n", rec.Name)
		return nil
	}
	if err := e.consent(cfg); err != nil {
		return err
	}
	if err := e.stop(dir, state.StopUser); err != nil {
		return err
	}
	if err := state.Update(dir, func(r *state.Record) error { r.Config = snap; return nil }); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "moat: %s takes its configuration from %s again\n", rec.Name, strings.Join(cfg.Sources, ", "))
	return nil
}

// sandboxNamed is the start of every command that acts on the existing
// sandbox its first argument names. A Kubernetes sandbox is refused
// here, naming what applies to it: the commands that serve one look it
// up with anySandboxNamed (kube.go).
func sandboxNamed(name string) (*env, string, *state.Record, error) {
	e, dir, rec, err := anySandboxNamed(name)
	if err == nil && rec.Runtime == runtimeKube {
		return nil, "", nil, kubeNotHere(rec)
	}
	return e, dir, rec, err
}
