package lockdown

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrNotJailed marks a process that Verify found not (or not fully) jailed.
var ErrNotJailed = errors.New("process is not jailed")

// Verify checks from outside, through /proc/<pid>, that every thread of
// process pid runs as c.UID and c.GID with no supplementary groups, no
// capabilities in any set, no_new_privs and a seccomp filter, and that its
// root is the read-only tmpfs Apply builds. The privileged parent calls it
// after the child reports it has applied the jail and before handing the
// child anything to serve, so a child that skipped Apply fails closed.
func Verify(pid int, c Config) error {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	statuses, err := filepath.Glob(filepath.Join(dir, "task", "*", "status"))
	if err != nil || len(statuses) == 0 {
		return fmt.Errorf("listing the threads of process %d: %v", pid, err)
	}
	var bad []string
	for _, p := range statuses {
		b, err := os.ReadFile(p)
		if err != nil {
			// A thread that exited between Glob and ReadFile is gone,
			// not unjailed.
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return fmt.Errorf("reading %s: %w", p, err)
		}
		for _, problem := range checkStatus(b, c.UID, c.GID) {
			bad = append(bad, fmt.Sprintf("thread %s: %s", filepath.Base(filepath.Dir(p)), problem))
		}
	}
	mi, err := os.ReadFile(filepath.Join(dir, "mountinfo"))
	if err != nil {
		return fmt.Errorf("reading the mounts of process %d: %w", pid, err)
	}
	if problem := checkRoot(mi); problem != "" {
		bad = append(bad, problem)
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: process %d: %s", ErrNotJailed, pid, strings.Join(bad, "; "))
	}
	return nil
}

// checkStatus returns what in one thread's /proc status is not as Apply
// leaves it.
func checkStatus(status []byte, uid, gid int) []string {
	fields := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	want := map[string]string{
		// real, effective, saved, file-system ids
		"Uid":        strings.Repeat(strconv.Itoa(uid)+"\t", 3) + strconv.Itoa(uid),
		"Gid":        strings.Repeat(strconv.Itoa(gid)+"\t", 3) + strconv.Itoa(gid),
		"Groups":     "",
		"CapInh":     "0000000000000000",
		"CapPrm":     "0000000000000000",
		"CapEff":     "0000000000000000",
		"CapBnd":     "0000000000000000",
		"CapAmb":     "0000000000000000",
		"NoNewPrivs": "1",
		"Seccomp":    "2", // SECCOMP_MODE_FILTER
	}
	var bad []string
	for _, k := range []string{"Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"} {
		got, ok := fields[k]
		if !ok {
			bad = append(bad, k+" missing")
		} else if got != want[k] {
			bad = append(bad, fmt.Sprintf("%s is %q, want %q", k, got, want[k]))
		}
	}
	return bad
}

// checkRoot returns what in a /proc/<pid>/mountinfo is not as Apply leaves
// the root: a read-only tmpfs. Of mounts stacked on /, the last is the one
// seen.
func checkRoot(mountinfo []byte) string {
	problem := "no root mount in mountinfo"
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 6 || len(g) < 1 || f[4] != "/" {
			continue
		}
		problem = ""
		if g[0] != "tmpfs" || !hasOption(f[5], "ro") {
			problem = fmt.Sprintf("root is %s mounted %s, want read-only tmpfs", g[0], f[5])
		}
	}
	return problem
}

func hasOption(opts, want string) bool {
	for _, o := range strings.Split(opts, ",") {
		if o == want {
			return true
		}
	}
	return false
}
