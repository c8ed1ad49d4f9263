package runtime

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"moat.dev/moat/internal/guestspec"
)

// allCaps is the capability set of the guest's root. They are gVisor's
// capabilities, enforced by its Sentry, not the host's: root in the guest is
// root of a kernel that has nothing of the host's but what is mounted.
var allCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
	"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
	"CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	"CAP_SYS_ADMIN", "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME",
	"CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_SETFCAP",
}

func (p *Plan) ociSpec(root string, binds []bindMount) *specs.Spec {
	env := append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, p.Env...)
	caps := &specs.LinuxCapabilities{Bounding: allCaps, Effective: allCaps, Permitted: allCaps}
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/run", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=755"}},
	}
	for _, b := range binds {
		// System directories keep setuid: sudo lives there.
		mounts = append(mounts, specs.Mount{Destination: b.Target, Type: "bind", Source: b.Source, Options: []string{"rbind", "rw"}})
	}
	mounts = append(mounts,
		bind(p.GuestDir, guestspec.Dir, false),
		bind(p.Moat, guestspec.Binary, false),
	)
	if p.Workspace != "" {
		mounts = append(mounts, bind(p.Workspace, p.Workspace, true))
	}
	for _, s := range p.Shares {
		mounts = append(mounts, bind(s.Source, s.Target, s.RW))
	}
	var rlimits []specs.POSIXRlimit
	if p.PidsMax > 0 {
		rlimits = append(rlimits, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: uint64(p.PidsMax), Soft: uint64(p.PidsMax)})
	}
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User:         specs.User{UID: 0, GID: 0},
			Args:         []string{guestspec.Binary, "__init"},
			Env:          env,
			Cwd:          "/",
			Capabilities: caps,
			Rlimits:      rlimits,
		},
		Root:     &specs.Root{Path: root},
		Hostname: p.Hostname,
		Mounts:   mounts,
		Linux: &specs.Linux{
			CgroupsPath: p.CgroupsPath,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				// The shim's own network namespace, the one holding tap0:
				// runsc scrapes its interfaces and gives them to gVisor.
				{Type: specs.NetworkNamespace, Path: "/proc/self/ns/net"},
			},
		},
	}
}

func bind(src, dst string, rw bool) specs.Mount {
	opts := []string{"rbind", "nosuid", "nodev"}
	if rw {
		opts = append(opts, "rw")
	} else {
		opts = append(opts, "ro")
	}
	return specs.Mount{Destination: filepath.Clean(dst), Type: "bind", Source: src, Options: opts}
}

func writeSpec(path string, s *specs.Spec) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding OCI spec: %w", err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("writing OCI spec: %w", err)
	}
	return nil
}
