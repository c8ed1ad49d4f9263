package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"time"

	"gvisor.dev/gvisor/pkg/seccomp"
	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
	"gvisor.dev/gvisor/pkg/sentry/platform"
	bootconfig "gvisor.dev/gvisor/runsc/boot/filter/config"
)

// sentryChildEnv marks the child process that precompiles the sentry's
// programs (precompileSentryAsPID1).
const sentryChildEnv = "MOAT_RUNSCFILTERS_SENTRY_CHILD"

// precompileSentryAsPID1 precompiles the sentry's programs for moat's
// options in a child process that is PID 1 of a new PID namespace, as
// the sentry is (runsc starts it in one). systrap's filter lets the
// sentry send itself SIGKILL (rt_tgsigqueueinfo to os.Getpid(), when a
// stub process was killed) with the pid taken when the rules are built,
// not as a variable, so a precompiled program holds the pid of the
// process that precompiled it; as PID 1 that is the sentry's own.
// Creating the namespace needs root, as scripts/setup.sh runs.
func precompileSentryAsPID1() ([]precompiledseccomp.Program, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	// The child's work is well under a second; a minute is a hang.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), sentryChildEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Pdeathsig: syscall.SIGKILL}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("precompiling the sentry's programs as PID 1 of a new PID namespace (needs root): %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	var programs []precompiledseccomp.Program
	if err := json.Unmarshal(stdout.Bytes(), &programs); err != nil {
		return nil, fmt.Errorf("reading the sentry's programs from the child that precompiled them: %w", err)
	}
	return programs, nil
}

// sentryChild is the child's work: the sentry's programs for moat's
// options, as JSON on stdout.
func sentryChild() error {
	if os.Getpid() != 1 {
		return errors.New("the sentry's programs must be precompiled as PID 1 of a PID namespace (precompileSentryAsPID1)")
	}
	boot, _, err := moatOptions()
	if err != nil {
		return err
	}
	programs, err := precompileSentry(boot)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(programs)
}

// precompileSentry precompiles the sentry's programs for opts, as
// gVisor's bootconfig.PrecompiledPrograms does for each options of its
// own matrix. That function makes every program of the matrix, hundreds,
// most of a minute of CPU for the handful moat uses (docs/benchmarks.md),
// and the per-options function it calls (rules with stand-in variables)
// is unexported. The exported Rules(opt) reaches it with opt.Vars(),
// which takes the platform's variables last; so a platform whose
// Variables are the precompiler's stand-ins for every variable makes
// Rules build with those. Should gVisor change that, Precompile fails (a
// stand-in missing from the bytecode), and TestProgramsAreRunscs compares
// every program with the filter runsc would build at start.
func precompileSentry(opts []bootconfig.Options) ([]precompiledseccomp.Program, error) {
	programs := make([]precompiledseccomp.Program, 0, len(opts))
	for _, opt := range opts {
		names := slices.Sorted(maps.Keys(opt.Vars()))
		p, err := precompiledseccomp.Precompile(opt.ConfigKey(), names, func(v precompiledseccomp.Values) *seccomp.Program {
			o := opt
			o.Platform = standIns{opt.Platform, v}
			rules, denyRules := bootconfig.Rules(o)
			// As bootconfig.PrecompiledPrograms builds each program.
			return &seccomp.Program{
				RuleSets: []seccomp.RuleSet{
					{Rules: denyRules.Copy()},
					{Rules: rules.Copy(), Action: seccomp.Allow},
				},
				Options: bootconfig.SeccompOptions(opt),
			}
		})
		if err != nil {
			return nil, fmt.Errorf("precompiling the sentry's program for %s: %w", opt.ConfigKey(), err)
		}
		programs = append(programs, p)
	}
	return programs, nil
}

// standIns is a platform's seccomp information whose variables are the
// precompiler's stand-ins, the sentry's own (its pid, its control
// socket) as well as the platform's.
type standIns struct {
	platform.SeccompInfo
	vars precompiledseccomp.Values
}

func (s standIns) Variables() precompiledseccomp.Values { return s.vars.Copy() }
