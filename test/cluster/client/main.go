// Command client is what runs inside a sandbox pod in the cluster tests
// (test/cluster): a static binary in an image of its own, run through
// the API's exec. It does what an agent would (resolve a name, send a
// request with its credential) and reports what it saw on stdout, one
// "key=value" line each, for the test to read.
//
//	client sleep                      wait for SIGTERM (the pod's main process)
//	client get URL [CONNECT_IP [TOK]] GET URL with "Authorization: Bearer $TOKEN" (or TOK);
//	                                  with CONNECT_IP, dial it instead of resolving
//	client loop URL N                 N requests to URL/r/<i>, one line each
//	client bench URL N [CONNECT_IP]   N requests, one connection each; prints the mean time
//	client say OUT ERR CODE           OUT and a newline on stdout, ERR on stderr, exit CODE
//	client cat                        stdin to stdout, until its end
//	client kill N                     kill itself with signal N
//	client tty                        whether stdin and stdout are terminals, and the size
//	                                  (waiting up to 3 s for the size to arrive)
//	client find HEX                   whether the bytes HEX encodes are in the environment
//	                                  or any file (hex, so that they are not in argv)
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: client sleep|get|loop|find ...")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "sleep":
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
		<-sigs
	case "get":
		connect := ""
		if len(os.Args) > 3 && os.Args[3] != "-" {
			connect = os.Args[3]
		}
		if len(os.Args) > 4 {
			os.Setenv("TOKEN", os.Args[4])
		}
		get(client(connect), os.Args[2])
	case "loop":
		n, _ := strconv.Atoi(os.Args[3])
		c := client("")
		for i := range n {
			get(c, fmt.Sprintf("%s/r/%d", os.Args[2], i))
			time.Sleep(50 * time.Millisecond)
		}
	case "bench":
		n, _ := strconv.Atoi(os.Args[3])
		connect := ""
		if len(os.Args) > 4 {
			connect = os.Args[4]
		}
		c := client(connect)
		t0 := time.Now()
		failed := 0
		for range n {
			resp, err := c.Get(os.Args[2])
			if err != nil {
				failed++
				continue
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				failed++
			}
		}
		fmt.Printf("requests=%d failed=%d mean_us=%d\n", n, failed, time.Since(t0).Microseconds()/int64(max(n, 1)))
	case "say":
		if len(os.Args) != 5 {
			fmt.Fprintln(os.Stderr, "say OUT ERR CODE")
			os.Exit(2)
		}
		code, _ := strconv.Atoi(os.Args[4])
		fmt.Println(os.Args[2])
		fmt.Fprint(os.Stderr, os.Args[3])
		os.Exit(code)
	case "cat":
		io.Copy(os.Stdout, os.Stdin)
	case "kill":
		n, _ := strconv.Atoi(os.Args[2])
		syscall.Kill(os.Getpid(), syscall.Signal(n))
		time.Sleep(10 * time.Second)
	case "tty":
		// The exec stream sends the terminal's size just after the
		// command starts: wait a moment for it.
		ws, err := unix.IoctlGetWinsize(0, unix.TIOCGWINSZ)
		for i := 0; i < 60 && err == nil && ws.Col == 0; i++ {
			time.Sleep(50 * time.Millisecond)
			ws, err = unix.IoctlGetWinsize(0, unix.TIOCGWINSZ)
		}
		_, outErr := unix.IoctlGetTermios(1, unix.TCGETS)
		if err != nil {
			fmt.Printf("stdin_tty=false stdout_tty=%v\n", outErr == nil)
			return
		}
		fmt.Printf("stdin_tty=true stdout_tty=%v size=%dx%d\n", outErr == nil, ws.Col, ws.Row)
	case "find":
		v, err := hex.DecodeString(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, "find takes hex")
			os.Exit(2)
		}
		find(string(v))
	default:
		fmt.Fprintln(os.Stderr, "unknown command", os.Args[1])
		os.Exit(2)
	}
}

func client(connect string) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if connect != "" {
				_, port, _ := net.SplitHostPort(addr)
				addr = net.JoinHostPort(connect, port)
			}
			return d.DialContext(ctx, network, addr)
		},
		TLSClientConfig:   &tls.Config{}, // SSL_CERT_FILE: the gate's CA
		DisableKeepAlives: true,
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func get(c *http.Client, url string) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		fmt.Printf("error=%q\n", err.Error())
		return
	}
	if tok := os.Getenv("TOKEN"); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := c.Do(req)
	if err != nil {
		fmt.Printf("url=%s error=%q\n", url, err.Error())
		return
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	fmt.Printf("url=%s status=%d body=%q\n", url, resp.StatusCode, body)
}

// find looks for value in the environment and in every regular file the
// process can read, /proc/self included (its environment and command
// line), other processes' and the kernel's pseudo-files excluded.
func find(value string) {
	v := []byte(value)
	if strings.Contains(strings.Join(os.Environ(), "\n"), value) {
		fmt.Println("found=env")
	}
	for _, p := range []string{"/proc/self/environ", "/proc/self/cmdline", "/proc/1/environ"} {
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, v) {
			fmt.Println("found=" + p)
		}
	}
	files := 0
	filepath.WalkDir("/", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && (p == "/proc" || p == "/sys" || p == "/dev") {
			return filepath.SkipDir
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if info, err := d.Info(); err != nil || info.Size() > 64<<20 {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		files++
		if bytes.Contains(b, v) {
			fmt.Println("found=" + p)
		}
		return nil
	})
	fmt.Printf("searched=%d\n", files)
}
