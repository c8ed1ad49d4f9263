package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"moat.dev/moat/internal/dockerrt"
)

const usage = `moat-docker: the Docker engine's side of moat's runtime = "docker".
moat runs it (it is not meant to be typed); its protocol is internal/dockerrt's
package doc.

  moat-docker info                     the engine's version and runtimes
  moat-docker prepare DIR NAME IMAGE   record a new sandbox's image and runtime
  moat-docker up < OPTIONS-JSON        start the sandbox at DIR unless it runs
  moat-docker stop DIR                 stop its containers, keep them
  moat-docker down DIR                 remove its containers and networks
  moat-docker forward DIR PID          hold the sandbox's port forwards while PID
                                       (the workload's init) lives; up starts it
  moat-docker hold                     wait for SIGTERM: the network holder
                                       container's only process
  moat-docker version                  this binary's version

Results are JSON on stdout; errors are on stderr, each line beginning
"moat-docker: ", with exit code 3 (engine unreachable or not local),
4 (no docker record), 5 (no such image) or 1 (anything else).
`

// Main is moat-docker: one engine operation per run, its result as JSON
// on stdout. SIGTERM and SIGINT cancel the operation, which undoes a
// half-made start.
func Main(args []string, version string) int {
	if len(args) < 2 || args[1] == "-h" || args[1] == "--help" || args[1] == "help" {
		fmt.Fprint(os.Stderr, usage)
		if len(args) < 2 {
			return 2
		}
		return 0
	}
	if args[1] == "version" {
		fmt.Println(version)
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	out, err := run(ctx, args[1], args[2:], os.Stdin)
	if err == nil {
		err = json.NewEncoder(os.Stdout).Encode(out)
	}
	if err != nil {
		for _, l := range strings.Split(err.Error(), "\n") {
			fmt.Fprintln(os.Stderr, dockerrt.ErrorPrefix+l)
		}
		return dockerrt.ExitCode(err)
	}
	return 0
}

// errUsage: moat-docker was run with arguments no moat sends.
var errUsage = errors.New("bad arguments; see: moat-docker --help")

// done is the result of an operation that returns nothing else.
type done struct {
	Schema int `json:"schema"`
}

func run(ctx context.Context, op string, args []string, stdin io.Reader) (any, error) {
	want := map[string]int{"info": 0, "prepare": 3, "up": 0, "stop": 1, "down": 1, "forward": 2, "hold": 0}
	n, ok := want[op]
	if !ok || len(args) != n {
		return nil, fmt.Errorf("%s %q: %w", op, args, errUsage)
	}
	if op == "hold" {
		// The network holder (sandbox.go's createHolder): it only has
		// to exist, owning the namespace, until Docker stops it.
		<-ctx.Done()
		return done{1}, nil
	}
	if op == "forward" {
		// Asks nothing of the engine: the workload's namespace and the
		// record are all it needs.
		pid, err := strconv.Atoi(args[1])
		if err != nil || pid <= 1 {
			return nil, fmt.Errorf("forward: %q is not the workload's pid: %w", args[1], errUsage)
		}
		return done{1}, Forward(ctx, args[0], pid)
	}
	var o dockerrt.Options
	if op == "up" {
		// Read before the engine is asked anything: a request from a
		// newer moat is refused whole, not half understood.
		if err := json.NewDecoder(io.LimitReader(stdin, 1<<20)).Decode(&o); err != nil {
			return nil, fmt.Errorf("reading the start's options on stdin: %w", err)
		}
		if o.Schema > dockerrt.Schema {
			return nil, fmt.Errorf("the start's options have schema %d, newer than this moat-docker's %d; install moat's binaries from one build", o.Schema, dockerrt.Schema)
		}
		if o.Guest == nil || o.Dir == "" || o.Moat == "" || o.Gate == "" {
			return nil, errors.New("the start's options lack dir, moat, gate or guest")
		}
		o.Warn = os.Stderr
	}
	e, err := Connect(ctx)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	switch op {
	case "info":
		i := dockerrt.Info{Schema: 1}
		if i.Version, i.API, err = e.Version(ctx); err != nil {
			return nil, err
		}
		i.Runsc, err = e.HasRuntime(ctx, "runsc")
		return i, err
	case "prepare":
		return Prepare(ctx, e, args[0], args[1], args[2])
	case "up":
		return Up(ctx, e, o)
	case "stop":
		return done{1}, Stop(ctx, e, args[0])
	default:
		return done{1}, Down(ctx, e, args[0])
	}
}
