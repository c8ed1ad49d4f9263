package dockerrt

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"moat.dev/moat/internal/helperproc"
)

// ErrUnreachable matches an error about reaching the Docker engine.
var ErrUnreachable = errors.New("the Docker engine is not reachable")

// ErrNotLocal is returned for an engine moat cannot isolate the workload
// on: one on another host, or a rootless one, whose bridges and
// containers' namespaces are not the host's that moat edits.
var ErrNotLocal = errors.New("moat needs the local, rootful Docker engine")

// ErrNoImage is returned for an image Docker's store does not have.
var ErrNoImage = errors.New("docker has no such image")

// Exit codes of moat-docker (package doc), each an error's class. Frozen:
// moat and moat-docker of different builds may meet. 2 is left out: Go
// exits with it on a panic.
const (
	ExitOK          = 0
	ExitError       = 1
	ExitUnreachable = 3 // ErrUnreachable, ErrNotLocal
	ExitNoRecord    = 4 // ErrNoRecord
	ExitNoImage     = 5 // ErrNoImage
)

// helperName is moat-docker's name in messages; helperproc reads the
// lines that begin with it and ": " as the error (ErrorPrefix).
const helperName = "moat-docker"

// ErrorPrefix begins each line of moat-docker's error message on its
// stderr; every other line there is for the user (warnings), which moat
// passes on as it comes.
const ErrorPrefix = helperName + ": "

// ExitCode is the exit code of err's class.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, ErrUnreachable), errors.Is(err, ErrNotLocal):
		return ExitUnreachable
	case errors.Is(err, ErrNoRecord):
		return ExitNoRecord
	case errors.Is(err, ErrNoImage):
		return ExitNoImage
	}
	return ExitError
}

// classes are the sentinels the exit codes stand for, on moat's side.
var classes = map[int]error{ExitUnreachable: ErrUnreachable, ExitNoRecord: ErrNoRecord, ExitNoImage: ErrNoImage}

// HelperError is a failed moat-docker command: its message, and the
// class its exit code names, which errors.Is matches.
type HelperError = helperproc.Error

// Info is `moat-docker info`: the engine's version and whether it has
// runsc registered.
type Info struct {
	Schema  int    `json:"schema"`
	Version string `json:"version"`
	API     string `json:"api"`
	Runsc   bool   `json:"runsc"`
}

// Helper runs moat-docker, the binary that holds the Docker SDK, as git
// runs git-remote-http for libcurl: moat links neither the SDK nor what
// it pulls in (a registry reference's regexps, compiled at every start,
// and OpenTelemetry), and every moat process, a sandbox's keeper, gate
// process and shim among them, starts without them.
type Helper struct {
	// Path is moat-docker, next to moat.
	Path string
	// Stderr receives moat-docker's warnings as they come.
	Stderr io.Writer
}

// stopGrace is moat-docker's time between SIGTERM, when the caller gives
// up, and SIGKILL: long enough to remove what a cancelled start made.
const stopGrace = 20 * time.Second

// run runs `moat-docker op args...` with stdin, and decodes its stdout
// into out (nil: no result).
func (h Helper) run(ctx context.Context, stdin []byte, out any, op string, args ...string) error {
	b := helperproc.Binary{Name: helperName, Path: h.Path, Stderr: h.Stderr,
		Env: helperEnv(os.Environ()), Grace: stopGrace, Classes: classes}
	// On the caller's deadline moat-docker is asked to stop, which
	// cancels what it does and removes a half-made start's containers.
	cmd := b.Command(ctx, op, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout []byte
	err := b.Run(ctx, cmd, op, func(r io.Reader) (err error) {
		stdout, err = io.ReadAll(r)
		return err
	})
	if err != nil || out == nil {
		return err
	}
	if err := json.Unmarshal(stdout, out); err != nil {
		return fmt.Errorf("reading what %s %s answered: %w", h.Path, op, err)
	}
	return nil
}

// helperEnv is the part of moat's environment moat-docker gets: what the
// Docker client reads (DOCKER_*), and the basics. moat's environment
// holds the values of env: secrets, which moat-docker gets on its stdin
// when it needs them, never in its /proc/PID/environ.
func helperEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "DOCKER_"), k == RuntimeEnv, k == "PATH", k == "HOME", k == "TMPDIR", k == "LANG", strings.HasPrefix(k, "LC_"):
			out = append(out, kv)
		}
	}
	return out
}

// Info asks the engine for its version and runtimes.
func (h Helper) Info(ctx context.Context) (*Info, error) {
	var i Info
	return &i, h.run(ctx, nil, &i, "info")
}

// Prepare writes a new sandbox's record (engine.Prepare) and returns it.
func (h Helper) Prepare(ctx context.Context, dir, name, image string) (*Record, error) {
	var r Record
	return &r, h.run(ctx, nil, &r, "prepare", dir, name, image)
}

// Up starts the sandbox (engine.Up) and returns its record when its guest
// agent accepts connections.
func (h Helper) Up(ctx context.Context, o Options) (*Record, error) {
	o.Schema = Schema
	req, err := json.Marshal(o)
	if err != nil {
		return nil, err
	}
	var r Record
	return &r, h.run(ctx, req, &r, "up")
}

// Stop stops the sandbox's containers and keeps them (engine.Stop).
func (h Helper) Stop(ctx context.Context, dir string) error {
	return h.run(ctx, nil, nil, "stop", dir)
}

// Down removes the sandbox's containers, networks and host rules
// (engine.Down).
func (h Helper) Down(ctx context.Context, dir string) error {
	return h.run(ctx, nil, nil, "down", dir)
}
