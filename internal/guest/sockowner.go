package guest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// SockOwner names the guest process that owns the TCP socket bound to the
// local port: "pid 123 curl -s https://example.com/". The interactive gate
// shows it beside a held connection, so a person deciding sees who asks,
// not only where to. It reads /proc/net/tcp for the socket's inode, then
// every process's fds for that inode; run it as root to see every process.
func SockOwner(port uint16) (string, error) {
	inode, err := socketInode("/proc/net/tcp", port)
	if err != nil {
		return "", err
	}
	want := "socket:[" + inode + "]"
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		fds, err := os.ReadDir(filepath.Join(p, "fd"))
		if err != nil {
			continue // gone, or not ours to read
		}
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join(p, "fd", fd.Name())); err == nil && l == want {
				cmd, _ := os.ReadFile(filepath.Join(p, "cmdline"))
				line := strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))
				if len(line) > 160 {
					line = line[:160] + "…"
				}
				return fmt.Sprintf("pid %s %s", filepath.Base(p), line), nil
			}
		}
	}
	return "", fmt.Errorf("no process holds socket %s", inode)
}

// socketInode finds the inode of the socket whose local port is port in
// a /proc/net/tcp table.
func socketInode(table string, port uint16) (string, error) {
	f, err := os.Open(table)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[0] == "sl" {
			continue
		}
		_, hexPort, ok := strings.Cut(fields[1], ":")
		if !ok {
			continue
		}
		if p, err := strconv.ParseUint(hexPort, 16, 16); err == nil && uint16(p) == port && fields[9] != "0" {
			return fields[9], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", errors.New("no socket on local port " + strconv.Itoa(int(port)))
}
