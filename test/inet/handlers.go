package inet

// Handlers for the TLS inspection tests: an upstream the gate terminates must be shown to pass
// every kind of HTTP traffic an agent's tools produce, and to change only what it should. Each
// handler reports what it received in a form the guest can print and the test can check
// against the server's own record (Server.Requests), so a test needs no trust in the path
// between them.

import (
	"bufio"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/http/cgi"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// EchoReply is the JSON body Echo answers with.
type EchoReply struct {
	Method string              `json:"method"`
	Host   string              `json:"host"`
	Path   string              `json:"path"`
	Query  string              `json:"query"` // raw, without '?'
	Proto  string              `json:"proto"` // "HTTP/1.1", "HTTP/2.0"
	Header map[string][]string `json:"header"`
}

// EchoHeaderPrefix starts the response headers that reflect the request: every request header
// H comes back as X-Echo-H (same values), the raw query as X-Echo-Query. A secret that the
// gate swapped in on the way up comes back both in a response header and in the body, the two
// places the gate must scrub on the way down.
const EchoHeaderPrefix = "X-Echo-"

// Echo answers any request with what it received: its head as EchoReply (JSON) and, reflected,
// in response headers. A request body is read and dropped.
func Echo() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, io.LimitReader(r.Body, maxEchoBody))
		rep := EchoReply{Method: r.Method, Host: r.Host, Path: r.URL.Path, Query: r.URL.RawQuery, Proto: r.Proto, Header: r.Header.Clone()}
		keys := make([]string, 0, len(r.Header))
		for k := range r.Header {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			for _, v := range r.Header[k] {
				w.Header().Add(EchoHeaderPrefix+k, v)
			}
		}
		if r.URL.RawQuery != "" {
			w.Header().Set(EchoHeaderPrefix+"Query", r.URL.RawQuery)
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(rep)
	})
}

// EchoElsewhere echoes the request's Authorization where the usual header and body path of a
// proxy does not see it: in a 103 Early Hints response (X-Echo-Hint, and in a Link) before the
// answer, and in a trailer (X-Echo-Trailer), declared, after a short body. Over HTTP/1.1 the body
// is chunked, which trailers need; over HTTP/2 they are a trailing HEADERS frame.
func EchoElsewhere() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, io.LimitReader(r.Body, maxEchoBody))
		auth := r.Header.Get("Authorization")
		h := w.Header()
		h.Set("X-Echo-Hint", auth)
		h.Set("Link", "</hint?auth="+url.QueryEscape(auth)+">; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		h.Del("X-Echo-Hint")
		h.Del("Link")
		h.Set("Trailer", "X-Echo-Trailer")
		h.Set("Content-Type", "text/plain")
		io.WriteString(w, "trailers follow\n")
		h.Set("X-Echo-Trailer", auth)
	})
}

// maxEchoBody bounds what Echo reads of a body it does not need.
const maxEchoBody = 1 << 20

// UploadReply is the JSON body Upload answers with.
type UploadReply struct {
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"` // hex
	Chunks int    `json:"chunks"` // reads that returned data: more than one shows the body streamed
}

// Upload reads the whole request body, any method, keeping nothing but a count and a digest, and
// answers with them: the sink of large-upload tests, which compare the digest with the one of
// what they sent.
func Upload() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		var rep UploadReply
		buf := make([]byte, 256<<10)
		for {
			k, err := r.Body.Read(buf)
			if k > 0 {
				rep.Bytes += int64(k)
				rep.Chunks++
				h.Write(buf[:k])
			}
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				http.Error(w, "inet: reading the upload: "+err.Error(), http.StatusBadRequest)
				return
			}
		}
		rep.SHA256 = hex.EncodeToString(h.Sum(nil))
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(rep)
	})
}

// Counting answers /anything?n=<count> with count bytes of Pattern: unlike zeros, a byte that
// was dropped, repeated or moved changes the digest.
func Counting() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		size, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		if err != nil || size < 0 {
			http.Error(w, "inet: ask for ?n=<count>", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		if r.Method == http.MethodHead {
			return
		}
		var off int64
		buf := make([]byte, 1<<20)
		for off < size {
			k := min(size-off, int64(len(buf)))
			Pattern(buf[:k], off)
			if _, err := w.Write(buf[:k]); err != nil {
				return
			}
			off += k
		}
	})
}

// Pattern fills p with the bytes of the counting stream starting at offset off: each aligned
// 8-byte word holds its own offset, big-endian. Cheap to make at gigabit rates, and every
// position is distinct.
func Pattern(p []byte, off int64) {
	var word [8]byte
	for i := 0; i < len(p); {
		pos := off + int64(i)
		base := pos &^ 7
		binary.BigEndian.PutUint64(word[:], uint64(base))
		k := copy(p[i:], word[pos-base:])
		i += k
	}
}

// PatternSHA256 is the hex SHA-256 of the first n bytes of the counting stream.
func PatternSHA256(n int64) string {
	h := sha256.New()
	writePattern(h, n)
	return hex.EncodeToString(h.Sum(nil))
}

func writePattern(h hash.Hash, n int64) {
	buf := make([]byte, 1<<20)
	for off := int64(0); off < n; {
		k := min(n-off, int64(len(buf)))
		Pattern(buf[:k], off)
		h.Write(buf[:k])
		off += k
	}
}

// WritePatternFile writes the first n bytes of the counting stream to path: the body of an
// upload whose digest the test knows.
func WritePatternFile(path string, n int64) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("creating the upload file: %w", err)
	}
	buf := make([]byte, 1<<20)
	for off := int64(0); off < n; {
		k := min(n-off, int64(len(buf)))
		Pattern(buf[:k], off)
		if _, err := f.Write(buf[:k]); err != nil {
			f.Close()
			return fmt.Errorf("writing the upload file: %w", err)
		}
		off += k
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing the upload file: %w", err)
	}
	return nil
}

// SSEEvent is the data of one event SSE sends.
type SSEEvent struct {
	I      int   `json:"i"`
	SentNS int64 `json:"sent_ns"` // server clock, Unix nanoseconds, when the event was written
}

// SSE answers with a text/event-stream of n events, gap apart, each flushed as it is written
// and carrying its send time, so a client can show that the events arrived one by one and not
// all at the end. ?n= and ?gap_ms= override the defaults (bounded: at most 100 events, 5 s
// apart).
func SSE(n int, gap time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v, err := strconv.Atoi(r.URL.Query().Get("n")); err == nil && v > 0 && v <= 100 {
			n = v
		}
		if v, err := strconv.Atoi(r.URL.Query().Get("gap_ms")); err == nil && v >= 0 && v <= 5000 {
			gap = time.Duration(v) * time.Millisecond
		}
		fl, ok := w.(http.Flusher)
		if !ok {
			http.Error(w, "inet: this connection cannot flush", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		fl.Flush()
		for i := 0; i < n; i++ {
			if i > 0 {
				select {
				case <-time.After(gap):
				case <-r.Context().Done():
					return
				}
			}
			b, _ := json.Marshal(SSEEvent{I: i, SentNS: time.Now().UnixNano()})
			if _, err := fmt.Fprintf(w, "id: %d\nevent: tick\ndata: %s\n\n", i, b); err != nil {
				return
			}
			fl.Flush()
		}
	})
}

// WebSocket limits: the echo is for short test messages.
const (
	wsMaxPayload = 1 << 20
	wsIdle       = 30 * time.Second // a client that says nothing this long is dropped
	wsGUID       = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
)

// WebSocketEcho accepts an RFC 6455 upgrade over HTTP/1.1 and echoes every text and binary
// message (fragments are echoed as they come), answers pings, and closes when the client does.
// Over HTTP/2, which cannot hijack, it answers 505 so the test sees why.
func WebSocketEcho() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 1 {
			http.Error(w, "inet: WebSocket echo needs HTTP/1.1", http.StatusHTTPVersionNotSupported)
			return
		}
		key := r.Header.Get("Sec-WebSocket-Key")
		if !headerHas(r.Header, "Connection", "upgrade") || !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") || key == "" {
			http.Error(w, "inet: not a WebSocket upgrade", http.StatusBadRequest)
			return
		}
		hj, ok := w.(http.Hijacker)
		if !ok {
			http.Error(w, "inet: cannot hijack this connection", http.StatusInternalServerError)
			return
		}
		c, rw, err := hj.Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n", WebSocketAccept(key))
		if err := rw.Flush(); err != nil {
			return
		}
		for {
			c.SetDeadline(time.Now().Add(wsIdle))
			op, fin, payload, err := readFrame(rw.Reader)
			if err != nil {
				return
			}
			switch op {
			case 0x8: // close: answer with the same code, then hang up
				writeFrame(rw.Writer, 0x8, true, payload)
				rw.Flush()
				return
			case 0x9: // ping
				op = 0xA
			case 0xA: // pong: nothing to answer
				continue
			}
			if err := writeFrame(rw.Writer, op, fin, payload); err != nil {
				return
			}
			if err := rw.Flush(); err != nil {
				return
			}
		}
	})
}

// WebSocketAccept is the Sec-WebSocket-Accept value for a client's key (RFC 6455 §4.2.2).
func WebSocketAccept(key string) string {
	h := sha1.Sum([]byte(key + wsGUID))
	return base64.StdEncoding.EncodeToString(h[:])
}

func headerHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// readFrame reads one client frame and unmasks it.
func readFrame(r *bufio.Reader) (op byte, fin bool, payload []byte, err error) {
	var h [2]byte
	if _, err = io.ReadFull(r, h[:]); err != nil {
		return
	}
	fin, op = h[0]&0x80 != 0, h[0]&0x0f
	masked := h[1]&0x80 != 0
	size := uint64(h[1] & 0x7f)
	switch size {
	case 126:
		var b [2]byte
		if _, err = io.ReadFull(r, b[:]); err != nil {
			return
		}
		size = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err = io.ReadFull(r, b[:]); err != nil {
			return
		}
		size = binary.BigEndian.Uint64(b[:])
	}
	if !masked {
		err = errors.New("inet: client frame not masked")
		return
	}
	if size > wsMaxPayload {
		err = fmt.Errorf("inet: frame of %d bytes is over the echo's %d", size, wsMaxPayload)
		return
	}
	var mask [4]byte
	if _, err = io.ReadFull(r, mask[:]); err != nil {
		return
	}
	payload = make([]byte, size)
	if _, err = io.ReadFull(r, payload); err != nil {
		return
	}
	for i := range payload {
		payload[i] ^= mask[i%4]
	}
	return
}

// writeFrame writes one unmasked server frame.
func writeFrame(w *bufio.Writer, op byte, fin bool, payload []byte) error {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	hdr := []byte{b0}
	switch k := len(payload); {
	case k < 126:
		hdr = append(hdr, byte(k))
	case k <= 0xffff:
		hdr = append(hdr, 126, byte(k>>8), byte(k))
	default:
		hdr = append(hdr, 127)
		hdr = binary.BigEndian.AppendUint64(hdr, uint64(k))
	}
	if _, err := w.Write(hdr); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

// Git serves the bare repositories under root over git's smart HTTP protocol, through the
// host's git http-backend as a CGI: clone, fetch and push (push is refused unless a repository
// sets http.receivepack). Mount it with http.StripPrefix so that the path below the mount
// point names the repository: /git/repo.git/info/refs → root/repo.git.
func Git(root string) http.Handler {
	backend := "/usr/lib/git-core/git-http-backend"
	if out, err := gitExecPath(); err == nil {
		backend = out + "/git-http-backend"
	}
	return &cgi.Handler{
		Path: backend,
		Root: "/",
		Env: []string{
			"GIT_PROJECT_ROOT=" + root,
			"GIT_HTTP_EXPORT_ALL=1",
		},
	}
}

// Site is the upstream of the TLS tests: every handler above on one mux, so one server (one
// name, one certificate) carries every kind of traffic.
//
//	/echo     Echo
//	/echo-elsewhere EchoElsewhere
//	/upload   Upload
//	/count    Counting (?n=)
//	/bytes    Bytes (?n=, zeros)
//	/sse      SSE(5, 300ms) (?n=, ?gap_ms=)
//	/ws       WebSocketEcho
//	/git/     Git(gitRoot), when gitRoot is not empty
//	/         the server's name line, as a nil handler gives
func Site(gitRoot string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/echo", Echo())
	mux.Handle("/echo/", Echo())
	mux.Handle("/echo-elsewhere", EchoElsewhere())
	mux.Handle("/upload", Upload())
	mux.Handle("/count", Counting())
	mux.Handle("/bytes", Bytes())
	mux.Handle("/sse", SSE(5, 300*time.Millisecond))
	mux.Handle("/ws", WebSocketEcho())
	if gitRoot != "" {
		mux.Handle("/git/", http.StripPrefix("/git", Git(gitRoot)))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "inet site %s%s\n", r.Host, r.URL.Path)
	})
	return mux
}

func gitExecPath() (string, error) {
	out, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		return "", fmt.Errorf("asking git for its exec path: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// GitRepo makes a bare repository root/name holding one commit of files (path → content), for
// Git to serve. It fails t when git is missing or fails.
func GitRepo(t testing.TB, root, name string, files map[string]string) {
	t.Helper()
	work := t.TempDir()
	git := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		// No user or system config: the test's repository is the same on every host.
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
			"GIT_AUTHOR_NAME=inet", "GIT_AUTHOR_EMAIL=inet@test", "GIT_COMMITTER_NAME=inet", "GIT_COMMITTER_EMAIL=inet@test")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("inet: git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	git(work, "init", "-q", "-b", "main")
	for p, content := range files {
		full := filepath.Join(work, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git(work, "add", "-A")
	git(work, "commit", "-q", "-m", "inet test repository")
	git(root, "clone", "-q", "--bare", work, name)
}
