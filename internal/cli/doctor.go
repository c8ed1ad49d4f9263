package cli

import (
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/spf13/cobra"

	"moat.dev/moat/internal/lockdown"
	"moat.dev/moat/internal/roles"
	"moat.dev/moat/internal/runtime"
)

// check is one thing moat needs from the host, and how to fix it.
type check struct {
	name string
	ok   func() (bool, string)
	fix  string
}

func newDoctorCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "doctor",
		Short: "Check what moat needs on this host and print the fix for each missing piece",
		Long: `Check what moat needs on this host (root, runsc, the tun, overlay and loop
modules, network namespaces, e2fsprogs, sudo for the host image) and print the
fix for each missing piece; say which gVisor platform auto chooses here.
Exits 4 when something is missing.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			exe, _ := os.Executable()
			runsc := roles.RunscPath(exe)
			var checks []check
			if rootless() {
				checks = append(checks, rootlessChecks()...)
			} else {
				checks = append(checks, check{"running as root", func() (bool, string) { return true, "" }, "run moat with sudo"})
			}
			checks = append(checks, []check{
				{"runsc (gVisor)", func() (bool, string) {
					out, err := exec.Command(runsc, "--version").Output()
					if err != nil {
						return false, runsc
					}
					return true, strings.SplitN(string(out), "\n", 2)[0]
				}, "build it with: ./scripts/setup.sh (or set MOAT_RUNSC)"},
				{"moat-sandbox (a sandbox's own processes)", func() (bool, string) {
					p, err := sandboxExe()
					if err != nil {
						return false, err.Error()
					}
					return true, p
				}, "build it beside moat with: sudo scripts/setup.sh"},
				{"/dev/net/tun", func() (bool, string) { return fileExists("/dev/net/tun"), "" }, "load the tun module: modprobe tun"},
				{"overlayfs", func() (bool, string) {
					b, _ := os.ReadFile("/proc/filesystems")
					return strings.Contains(string(b), "overlay"), ""
				}, "load the overlay module: modprobe overlay"},
				{"network namespaces", func() (bool, string) { return fileExists("/proc/self/ns/net"), "" }, "use a kernel with CONFIG_NET_NS"},
			}...)
			// Without root the guest cannot use the host's sudo nor a
			// disk image at all (rootlessNotes say so): no checks.
			if !rootless() {
				checks = append(checks, check{"sudo on the host (for image = \"host\")", func() (bool, string) {
					_, err := exec.LookPath("sudo")
					return err == nil, ""
				}, "apt-get install sudo"})
				checks = append(checks, diskChecks()...)
			}
			checks = append(checks, check{"the gate process's jail (mount namespace, seccomp, no capabilities)", func() (bool, string) {
				if err := lockdown.Supported(); err != nil {
					return false, err.Error()
				}
				return true, ""
			}, "use a Linux 5.2 or newer kernel with seccomp, on amd64 or arm64, and a moat built with CGO_ENABLED=0 (scripts/setup.sh)"})
			checks = append(checks, check{"gVisor platform", func() (bool, string) {
				// Informational: auto falls back to systrap, which always works.
				if k := runtime.HostKVM(); !k.Usable {
					return true, "systrap, as platform = \"auto\" chooses here: " + k.Why
				}
				return true, "kvm, as platform = \"auto\" chooses here"
			}, ""})
			bad := 0
			for _, ch := range checks {
				ok, detail := ch.ok()
				mark := "ok  "
				if !ok {
					mark = "FAIL"
					bad++
				}
				line := fmt.Sprintf("%s %s", mark, ch.name)
				if detail != "" {
					line += " (" + detail + ")"
				}
				fmt.Fprintln(c.OutOrStdout(), line)
				if !ok {
					fmt.Fprintln(c.OutOrStdout(), "     fix:", ch.fix)
				}
			}
			dockerNotes(c.OutOrStdout(), runsc)
			if rootless() {
				// What a sandbox lacks without root: never a failure.
				for _, n := range rootlessNotes() {
					fmt.Fprintf(c.OutOrStdout(), "note %s: %s\n", n.name, n.text)
				}
			}
			if bad > 0 {
				return codef(ExitHost, "%d check(s) failed", bad)
			}
			return nil
		},
	}
}
