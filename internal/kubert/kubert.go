package kubert

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/helperproc"
	"moat.dev/moat/internal/state"
)

// Schema is the version of every object of the protocol and of kube.json.
const Schema = 1

// RecordFile is the record's name in the sandbox's state directory.
const RecordFile = "kube.json"

// DefaultGateNamespace is where deploy/kubernetes puts the gate.
const DefaultGateNamespace = "moat-gate"

// GateLabel selects the gate's pods (deploy/kubernetes/gate-daemonset.yaml).
const GateLabel = "app.kubernetes.io/name=moat-gate"

// AuditContainer is the gate pod's container whose log is the node's audit
// records and nothing else (deploy/kubernetes/gate-daemonset.yaml).
const AuditContainer = "audit"

// Record is kube.json: where a sandbox's claim is. Field names frozen.
type Record struct {
	Schema        int    `json:"schema"`
	Context       string `json:"context,omitempty"`
	Namespace     string `json:"namespace"`
	Template      string `json:"template"`
	Pool          string `json:"pool"`
	GateNamespace string `json:"gate_namespace"`
	Claim         string `json:"claim"`
	ClaimUID      string `json:"claim_uid"`
	Sandbox       string `json:"sandbox,omitempty"`
	Pod           string `json:"pod,omitempty"`
	Node          string `json:"node,omitempty"`
	// Secret is the Secret the claim binds (AnnotationSecret); "": the
	// template's.
	Secret string `json:"secret,omitempty"`
}

// AnnotationSecret on a claim names the Secret whose values the gate
// swaps in for its sandbox (gateserve.AnnotationSecret, which a test
// holds equal; not imported, which would link the gate into moat).
const AnnotationSecret = "moat.dev/secret"

// ClaimRequest is `moat-kube claim`'s input: take a sandbox of Template
// for the moat sandbox Name, waiting at most Wait.
type ClaimRequest struct {
	Schema        int           `json:"schema"`
	Name          string        `json:"name"`
	Context       string        `json:"context,omitempty"`
	Namespace     string        `json:"namespace,omitempty"` // "": the context's, else "default"
	Template      string        `json:"template"`
	GateNamespace string        `json:"gate_namespace,omitempty"`
	Wait          time.Duration `json:"wait_ns"`
	Secret        string        `json:"secret,omitempty"` // "": the template's
}

// ExecResult is what `moat-kube exec` writes on fd 3: the command's exit
// code, or why it could not run (Error, with its class in Code).
type ExecResult struct {
	Schema   int    `json:"schema"`
	ExitCode int    `json:"exit_code"`
	Error    string `json:"error,omitempty"`
	Code     int    `json:"code,omitempty"`
}

// AuditRequest is `moat-kube audit`'s input.
type AuditRequest struct {
	Schema int    `json:"schema"`
	Record Record `json:"record"`
	Follow bool   `json:"follow,omitempty"`
}

// Ours says whether an audit record is about the claim whose UID is
// claimUID. The gate's log holds every sandbox of its node; a record
// without the claim's UID (a warm pod's before the claim took it,
// another claim's, the unknown sources') is never shown. An empty UID
// matches nothing: fail closed.
func Ours(r audit.Record, claimUID string) bool {
	return claimUID != "" && r.ClaimUID == claimUID
}

// ErrUnreachable matches an error about reaching the cluster: no
// kubeconfig, no such context, the API server not answering.
var ErrUnreachable = errors.New("the Kubernetes cluster is not reachable")

// ErrNotFound matches a template, warm pool, claim or pod that is not there.
var ErrNotFound = errors.New("not found on the cluster")

// ErrUsage matches a request that is wrong in itself (a name the API
// refuses, an ambiguous template).
var ErrUsage = errors.New("bad request")

// classed is an error of a class (ErrUnreachable, ErrNotFound,
// ErrUsage) whose message is its own: the class is for errors.Is and the
// exit code, and would read as noise in the sentence.
type classed struct {
	class error
	msg   string
}

func (e *classed) Error() string { return e.msg }
func (e *classed) Unwrap() error { return e.class }

// Errorf is an error of class with the message format makes.
func Errorf(class error, format string, a ...any) error {
	return &classed{class: class, msg: fmt.Sprintf(format, a...)}
}

// Exit codes of moat-kube (frozen; 2 is Go's on a panic).
const (
	ExitOK          = 0
	ExitError       = 1
	ExitUnreachable = 3
	ExitNotFound    = 4
	ExitUsage       = 5
)

// binaryName is moat-kube's name: in messages, and in ErrorPrefix,
// which helperproc derives from it to find the error lines.
const binaryName = "moat-kube"

// ErrorPrefix begins each line of moat-kube's error message on stderr;
// other lines there (progress, warnings) are for the user.
const ErrorPrefix = binaryName + ": "

// ExitCode is the exit code of err's class.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, ErrUnreachable):
		return ExitUnreachable
	case errors.Is(err, ErrNotFound):
		return ExitNotFound
	case errors.Is(err, ErrUsage):
		return ExitUsage
	}
	return ExitError
}

var classes = map[int]error{ExitUnreachable: ErrUnreachable, ExitNotFound: ErrNotFound, ExitUsage: ErrUsage}

// HelperError is a failed moat-kube command: its message, and the class
// its exit code names, which errors.Is matches.
type HelperError = helperproc.Error

// Helper runs moat-kube, the binary that holds client-go.
type Helper struct {
	Path   string    // moat-kube, beside moat
	Stderr io.Writer // progress and warnings, as they come
}

// stopGrace is moat-kube's time between SIGTERM and SIGKILL: enough to
// delete a claim whose wait was cancelled.
const stopGrace = 10 * time.Second

// bin is moat-kube as helperproc runs it, with the caller's environment:
// a kubeconfig's credential plugin (exec:) runs from moat-kube as kubectl
// runs it, with the user's environment, which cloud logins need. The
// secrets a sandbox's gate swaps in never pass through moat here: they
// are Kubernetes Secrets the gate reads.
func (h Helper) bin() helperproc.Binary {
	return helperproc.Binary{Name: binaryName, Path: h.Path, Stderr: h.Stderr, Grace: stopGrace, Classes: classes}
}

// run runs op with stdin, hands each stdout line to line (nil: none
// expected) and returns its error.
func (h Helper) run(ctx context.Context, stdin any, line func([]byte) error, op string, args ...string) error {
	b := h.bin()
	cmd := b.Command(ctx, op, args...)
	if stdin != nil {
		in, err := json.Marshal(stdin)
		if err != nil {
			return err
		}
		cmd.Stdin = bytes.NewReader(in)
	}
	var read func(io.Reader) error // nil: Run drops what comes
	if line != nil {
		read = func(out io.Reader) error {
			sc := bufio.NewScanner(out)
			sc.Buffer(make([]byte, 64<<10), 4<<20)
			for sc.Scan() {
				if err := line(sc.Bytes()); err != nil {
					return err // Run drains the rest
				}
			}
			return nil
		}
	}
	return b.Run(ctx, cmd, op, read)
}

// Claim takes a sandbox from the template's warm pool and returns its
// record once its pod is Ready.
func (h Helper) Claim(ctx context.Context, req ClaimRequest) (*Record, error) {
	req.Schema = Schema
	var r *Record
	err := h.run(ctx, req, func(b []byte) error {
		r = new(Record)
		return json.Unmarshal(b, r)
	}, "claim")
	if err == nil && r == nil {
		err = errors.New("moat-kube claim answered nothing")
	}
	return r, err
}

// Release deletes the record's claim; a claim already gone is no error.
func (h Helper) Release(ctx context.Context, r Record) error {
	return h.run(ctx, r, nil, "release")
}

// Audit hands each of the claim's audit records to fn, oldest first; with
// req.Follow, until ctx ends.
func (h Helper) Audit(ctx context.Context, req AuditRequest, fn func(audit.Record)) error {
	req.Schema = Schema
	return h.run(ctx, req, func(b []byte) error {
		var r audit.Record
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("reading moat-kube audit's output: %w", err)
		}
		// moat-kube filters; this is the second check, so that a record
		// of another claim never reaches the user through a bug there.
		if Ours(r, req.Record.ClaimUID) {
			fn(r)
		}
		return nil
	}, "audit")
}

// ExecArgs are `moat-kube exec`'s arguments.
type ExecArgs struct {
	Record Record
	TTY    bool
	Argv   []string
}

func (a ExecArgs) args() ([]string, error) {
	b, err := json.Marshal(a.Record)
	if err != nil {
		return nil, err
	}
	out := []string{"--record", string(b)}
	if a.TTY {
		out = append(out, "--tty")
	}
	return append(append(out, "--"), a.Argv...), nil
}

// ParseExecArgs is the inverse of ExecArgs.args, for moat-kube.
func ParseExecArgs(args []string) (ExecArgs, error) {
	var a ExecArgs
	for len(args) > 0 {
		switch args[0] {
		case "--record":
			if len(args) < 2 {
				return a, Errorf(ErrUsage, "--record needs a value")
			}
			if err := json.Unmarshal([]byte(args[1]), &a.Record); err != nil {
				return a, Errorf(ErrUsage, "--record: %v", err)
			}
			args = args[2:]
		case "--tty":
			a.TTY = true
			args = args[1:]
		case "--":
			a.Argv = args[1:]
			if len(a.Argv) == 0 {
				return a, Errorf(ErrUsage, "no command after --")
			}
			return a, nil
		default:
			return a, Errorf(ErrUsage, "unknown argument %q", args[0])
		}
	}
	return a, Errorf(ErrUsage, "no command: give it after --")
}

// Exec runs a.Argv in the claim's pod with stdin, stdout and stderr, and
// returns the command's exit code; an error when it could not run it.
func (h Helper) Exec(ctx context.Context, a ExecArgs, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	args, err := a.args()
	if err != nil {
		return 0, err
	}
	b := h.bin()
	cmd := b.Command(ctx, "exec", args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	resR, resW, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	cmd.ExtraFiles = []*os.File{resW} // fd 3
	if err := cmd.Start(); err != nil {
		resR.Close()
		resW.Close()
		return 0, fmt.Errorf("running %s: %w", h.Path, err)
	}
	resW.Close()
	out, rerr := io.ReadAll(io.LimitReader(resR, 1<<20))
	resR.Close()
	werr := cmd.Wait()
	var res ExecResult
	if rerr != nil || len(bytes.TrimSpace(out)) == 0 || json.Unmarshal(out, &res) != nil {
		// No result: moat-kube died (a signal, a panic) before it knew.
		return 0, fmt.Errorf("moat-kube exec ended without a result (%v)", werr)
	}
	if res.Error != "" {
		return 0, b.Err("exec", res.Code, res.Error)
	}
	return res.ExitCode, nil
}

// WriteRecord writes kube.json into the sandbox's state directory.
func WriteRecord(dir string, r Record) error {
	r.Schema = Schema
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return state.WriteAtomic(filepath.Join(dir, RecordFile), append(b, '\n'), 0o600)
}

// LoadRecord reads kube.json.
func LoadRecord(dir string) (Record, error) {
	var r Record
	b, err := os.ReadFile(filepath.Join(dir, RecordFile))
	if err != nil {
		return r, fmt.Errorf("reading the sandbox's claim record: %w", err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("reading %s: %w", filepath.Join(dir, RecordFile), err)
	}
	if r.Schema > Schema {
		return r, fmt.Errorf("%s has schema %d, newer than this moat understands (%d); upgrade moat", filepath.Join(dir, RecordFile), r.Schema, Schema)
	}
	return r, nil
}
