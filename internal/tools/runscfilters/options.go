package main

import (
	"flag"
	"fmt"
	"slices"
	"strings"

	"gvisor.dev/gvisor/pkg/sentry/platform"
	bootconfig "gvisor.dev/gvisor/runsc/boot/filter/config"
	runscconfig "gvisor.dev/gvisor/runsc/config"
	goferconfig "gvisor.dev/gvisor/runsc/fsgofer/filter/config"

	"moat.dev/moat/internal/runtime"

	// The platforms' constructors, which platform.Lookup finds.
	_ "gvisor.dev/gvisor/pkg/sentry/platform/platforms"
)

// moatPlatforms are the platforms runtime.ChoosePlatform can give runsc.
var moatPlatforms = []string{runtime.PlatformSystrap, runtime.PlatformKVM}

// runscConfig is runsc's configuration as moat runs it on platform: the
// global flags moat passes (runtime.RunscArgs) parsed by runsc's own
// flag set, so a flag moat adds later moves the selection with it.
func runscConfig(platform string) (*runscconfig.Config, error) {
	fs := flag.NewFlagSet("runsc", flag.ContinueOnError)
	runscconfig.RegisterFlags(fs)
	args := runtime.RunscArgs("/run/moat-runscfilters", platform, false)
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("parsing moat's runsc flags %q: %w", args, err)
	}
	conf, err := runscconfig.NewFromFlags(fs)
	if err != nil {
		return nil, fmt.Errorf("reading moat's runsc flags %q: %w", args, err)
	}
	return conf, nil
}

// bootOptions are the sentry's filter options for conf, as runsc's
// loader builds them (runsc/boot/loader.go, installSeccompFilters), with
// directfs both ways. The spec-driven parts (a GPU, TPU or RDMA device in
// the OCI spec) are left at the flags' values: moat's spec lists no
// devices.
func bootOptions(conf *runscconfig.Config) ([]bootconfig.Options, error) {
	c, err := platform.Lookup(conf.Platform)
	if err != nil {
		return nil, fmt.Errorf("looking up runsc platform %q: %w", conf.Platform, err)
	}
	hostnet := conf.Network == runscconfig.NetworkHost
	var opts []bootconfig.Options
	for _, info := range c.PrecompiledSeccompInfo() {
		for _, directFS := range directFSBoth(conf) {
			opts = append(opts, bootconfig.Options{
				Platform:              info,
				HostNetwork:           hostnet,
				HostNetworkRawSockets: hostnet && conf.EnableRaw,
				HostFilesystem:        directFS,
				ProfileEnable:         conf.ProfileEnable,
				NVProxy:               conf.NVProxy,
				TPUProxy:              conf.TPUProxy,
				RDMAProxy:             conf.RDMAProxy,
				// The generator runs with the CGO_ENABLED runsc is built
				// with (scripts/setup.sh exports it for both).
				CgoEnabled:    runscconfig.CgoEnabled,
				PluginNetwork: conf.Network == runscconfig.NetworkPlugin,
			})
		}
	}
	return opts, nil
}

// goferOptions are the gofer's filter options for conf, as runsc's gofer
// command builds them (runsc/cmd/gofer.go), with directfs both ways and
// with and without lisafs, which runsc decides from the sandbox's mounts.
// No extension rules: runsc registers none.
func goferOptions(conf *runscconfig.Config) []goferconfig.Options {
	var opts []goferconfig.Options
	for _, directFS := range directFSBoth(conf) {
		for _, lisafs := range []bool{true, false} {
			opts = append(opts, goferconfig.Options{
				UDSOpenEnabled:   conf.GetHostUDS().AllowOpen(),
				UDSCreateEnabled: conf.GetHostUDS().AllowCreate(),
				ProfileEnabled:   conf.ProfileEnable,
				DirectFS:         directFS,
				LisafsNeeded:     lisafs,
				CgoEnabled:       runscconfig.CgoEnabled,
			})
		}
	}
	return opts
}

// directFSBoth is conf's directfs setting first, then the other: moat
// passes no --directfs, but a program is small, and --directfs=false is
// the first thing to try when a gofer misbehaves; a sandbox run that way
// then starts as fast.
func directFSBoth(conf *runscconfig.Config) []bool {
	return []bool{conf.DirectFS, !conf.DirectFS}
}

// moatOptions are the sentry's and the gofer's filter options for every
// way moat runs runsc, one for each program name (ConfigKey), in the
// names' order.
func moatOptions() (boot []bootconfig.Options, gofer []goferconfig.Options, err error) {
	for _, p := range moatPlatforms {
		conf, err := runscConfig(p)
		if err != nil {
			return nil, nil, err
		}
		opts, err := bootOptions(conf)
		if err != nil {
			return nil, nil, err
		}
		boot = append(boot, opts...)
		gofer = append(gofer, goferOptions(conf)...)
	}
	return byKey(boot), byKey(gofer), nil
}

// byKey is opts sorted by ConfigKey, one for each.
func byKey[O interface{ ConfigKey() string }](opts []O) []O {
	slices.SortStableFunc(opts, func(a, b O) int { return strings.Compare(a.ConfigKey(), b.ConfigKey()) })
	return slices.CompactFunc(opts, func(a, b O) bool { return a.ConfigKey() == b.ConfigKey() })
}

// keys are opts' ConfigKeys.
func keys[O interface{ ConfigKey() string }](opts []O) []string {
	k := make([]string, len(opts))
	for i, o := range opts {
		k[i] = o.ConfigKey()
	}
	return k
}
