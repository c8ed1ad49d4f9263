package guest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// OOMKill kills the guest's largest process (PickVictim) with SIGKILL and
// says what it killed: "pid=N comm=NAME rss_kib=K". It runs in PID 1 (the
// agent answers the daemon's OOMKillRequest), which may kill anything.
func OOMKill() (string, error) {
	procs := listProcs()
	victim, ok := PickVictim(procs, Ancestors(procs, os.Getpid()))
	if !ok {
		return "", errors.New("no guest process to kill")
	}
	if err := unix.Kill(victim.PID, unix.SIGKILL); err != nil {
		return "", fmt.Errorf("killing pid %d (%s): %w", victim.PID, victim.Comm, err)
	}
	// Answer once the victim is dead (gone, or a zombie: its memory is
	// released at exit, before the reaping), so the daemon's next sample
	// can see the memory back. Bounded: a process stuck in the kernel
	// must not stall the guard.
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		p, ok := readProc(victim.PID)
		if !ok || p.State == "Z" {
			break
		}
	}
	return fmt.Sprintf("pid=%d comm=%s rss_kib=%d", victim.PID, strconv.Quote(victim.Comm), victim.RSSKiB), nil
}

// listProcs reads every process's status and oom_score_adj from /proc; a
// process that exits meanwhile is skipped.
func listProcs() []Proc {
	ents, _ := os.ReadDir("/proc")
	var out []Proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		p, ok := readProc(pid)
		if ok {
			out = append(out, p)
		}
	}
	return out
}

func readProc(pid int) (Proc, bool) {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	f, err := os.Open(filepath.Join(dir, "status"))
	if err != nil {
		return Proc{}, false
	}
	defer f.Close()
	p := Proc{PID: pid}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "Name":
			p.Comm = v
		case "PPid":
			p.PPID, _ = strconv.Atoi(v)
		case "State":
			if v != "" {
				p.State = v[:1]
			}
		case "VmRSS":
			p.RSSKiB, _ = strconv.ParseUint(strings.TrimSuffix(v, " kB"), 10, 64)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "oom_score_adj")); err == nil {
		p.OOMScoreAdj, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	return p, true
}
