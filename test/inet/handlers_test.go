package inet

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestHandlers runs the TLS tests' handlers behind a Net's HTTPS server, over HTTP/1.1 and
// HTTP/2, as the gate's upstream leg would reach them.
func TestHandlers(t *testing.T) {
	n := Start(t)
	gitRoot := t.TempDir()
	GitRepo(t, gitRoot, "repo.git", map[string]string{"README": "hello from inet\n"})
	site := n.HTTPS(t, "198.51.100.12", 443, []string{"site.test"}, Site(gitRoot))
	h1 := &http.Transport{Proxy: nil, TLSClientConfig: n.CA().ClientConfig("site.test")}
	h2 := &http.Transport{Proxy: nil, TLSClientConfig: n.CA().ClientConfig("site.test"), ForceAttemptHTTP2: true}
	t.Cleanup(h1.CloseIdleConnections)
	t.Cleanup(h2.CloseIdleConnections)
	base := "https://198.51.100.12"

	t.Run("http2", func(t *testing.T) {
		for _, tc := range []struct {
			tr   *http.Transport
			want int
		}{{h1, 1}, {h2, 2}} {
			resp := do(t, tc.tr, "GET", base+"/echo", "site.test", nil)
			resp.Body.Close()
			if resp.ProtoMajor != tc.want {
				t.Errorf("ForceAttemptHTTP2 %v: got %s, want HTTP/%d", tc.tr.ForceAttemptHTTP2, resp.Proto, tc.want)
			}
		}
	})
	t.Run("echo", func(t *testing.T) {
		req := request(t, "GET", base+"/echo/x?key=v1&b=2", "site.test", nil)
		req.Header.Set("Authorization", "Bearer ph-123")
		req.Header.Add("X-Two", "a")
		req.Header.Add("X-Two", "b")
		resp, err := (&http.Client{Transport: h2}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var got EchoReply
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
			t.Fatal(err)
		}
		if got.Method != "GET" || got.Host != "site.test" || got.Path != "/echo/x" || got.Query != "key=v1&b=2" || got.Proto != "HTTP/2.0" ||
			strings.Join(got.Header["Authorization"], ",") != "Bearer ph-123" || strings.Join(got.Header["X-Two"], ",") != "a,b" {
			t.Errorf("echo body: got %+v", got)
		}
		for _, c := range []struct{ name, want string }{
			{"X-Echo-Authorization", "Bearer ph-123"},
			{"X-Echo-X-Two", "a,b"},
			{"X-Echo-Query", "key=v1&b=2"},
		} {
			if got := strings.Join(resp.Header.Values(c.name), ","); got != c.want {
				t.Errorf("response header %s: got %q, want %q", c.name, got, c.want)
			}
		}
		if r := site.Requests(); len(r) == 0 || r[len(r)-1].Header.Get("Authorization") != "Bearer ph-123" {
			t.Errorf("the server's record lacks the request's Authorization: %+v", r)
		}
	})
	t.Run("upload", func(t *testing.T) {
		const size = 5<<20 + 3
		body := make([]byte, size)
		Pattern(body, 0)
		for _, tr := range []*http.Transport{h1, h2} {
			resp := do(t, tr, "PUT", base+"/upload", "site.test", bytes.NewReader(body))
			var got UploadReply
			json.NewDecoder(resp.Body).Decode(&got)
			resp.Body.Close()
			if want := PatternSHA256(size); got.Bytes != size || got.SHA256 != want || got.Chunks < 2 {
				t.Errorf("upload over %s: got %+v, want %d bytes, sha256 %s, several reads", resp.Proto, got, size, want)
			}
		}
	})
	t.Run("count", func(t *testing.T) {
		for _, size := range []int64{0, 7, 1<<20 + 5} {
			resp := do(t, h2, "GET", base+"/count?n="+strconv.FormatInt(size, 10), "site.test", nil)
			h := sha256.New()
			k, err := io.Copy(h, resp.Body)
			resp.Body.Close()
			if err != nil || k != size || hex.EncodeToString(h.Sum(nil)) != PatternSHA256(size) {
				t.Errorf("count %d: got %d bytes (%v), digest %x, want %s", size, k, err, h.Sum(nil), PatternSHA256(size))
			}
		}
		// Every word holds its own offset, so a shifted copy differs.
		p := make([]byte, 24)
		Pattern(p, 5)
		want := make([]byte, 32)
		for i := 0; i < 4; i++ {
			binary.BigEndian.PutUint64(want[i*8:], uint64(i*8))
		}
		if !bytes.Equal(p, want[5:29]) {
			t.Errorf("Pattern at offset 5: got %x, want %x", p, want[5:29])
		}
	})
	t.Run("sse", func(t *testing.T) {
		const gap = 150 * time.Millisecond
		for _, tr := range []*http.Transport{h1, h2} {
			resp := do(t, tr, "GET", base+"/sse?n=4&gap_ms=150", "site.test", nil)
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Errorf("content type %q", ct)
			}
			sc := bufio.NewScanner(resp.Body)
			var arrived []time.Time
			for sc.Scan() {
				data, ok := strings.CutPrefix(sc.Text(), "data: ")
				if !ok {
					continue
				}
				var ev SSEEvent
				if err := json.Unmarshal([]byte(data), &ev); err != nil || ev.I != len(arrived) || ev.SentNS == 0 {
					t.Errorf("event %d: %q (%v)", len(arrived), data, err)
				}
				arrived = append(arrived, time.Now())
			}
			resp.Body.Close()
			if len(arrived) != 4 {
				t.Fatalf("over %s: %d events, want 4", resp.Proto, len(arrived))
			}
			for i := 1; i < len(arrived); i++ {
				if d := arrived[i].Sub(arrived[i-1]); d < gap/2 {
					t.Errorf("over %s: event %d came %v after the one before, want about %v: not flushed one by one", resp.Proto, i, d, gap)
				}
			}
		}
	})
	t.Run("websocket", func(t *testing.T) {
		c, err := tls.Dial("tcp", site.Addr.String(), &tls.Config{RootCAs: n.CA().Pool, ServerName: "site.test", NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(clientTimeout))
		key := make([]byte, 16)
		rand.Read(key)
		k := base64.StdEncoding.EncodeToString(key)
		io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: site.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: "+k+"\r\n\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 101 || resp.Header.Get("Sec-WebSocket-Accept") != WebSocketAccept(k) {
			t.Fatalf("upgrade: %s, accept %q", resp.Status, resp.Header.Get("Sec-WebSocket-Accept"))
		}
		bw := bufio.NewWriter(c)
		for _, msg := range []string{"hello", strings.Repeat("x", 200), strings.Repeat("y", 70000)} {
			clientFrame(bw, 0x1, []byte(msg))
			op, fin, got, err := readServerFrame(br)
			if err != nil || op != 0x1 || !fin || string(got) != msg {
				t.Errorf("echo of %d bytes: op %x fin %v %d bytes (%v)", len(msg), op, fin, len(got), err)
			}
		}
		clientFrame(bw, 0x9, []byte("p"))
		if op, _, got, err := readServerFrame(br); err != nil || op != 0xA || string(got) != "p" {
			t.Errorf("ping: got op %x %q (%v), want a pong", op, got, err)
		}
		clientFrame(bw, 0x8, []byte{0x03, 0xe8})
		if op, _, _, err := readServerFrame(br); err != nil || op != 0x8 {
			t.Errorf("close: got op %x (%v)", op, err)
		}
		if WebSocketAccept("dGhlIHNhbXBsZSBub25jZQ==") != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" { // RFC 6455 §1.3
			t.Errorf("WebSocketAccept does not match the RFC's example")
		}
	})
	t.Run("git", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "clone")
		caFile := filepath.Join(t.TempDir(), "ca.pem")
		os.WriteFile(caFile, n.CA().PEM, 0o644)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "git", "-c", "http.curloptResolve=site.test:443:198.51.100.12",
			"clone", "-q", "https://site.test/git/repo.git", dst)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0", "GIT_SSL_CAINFO="+caFile)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git clone: %v\n%s", err, out)
		}
		if b, err := os.ReadFile(filepath.Join(dst, "README")); err != nil || string(b) != "hello from inet\n" {
			t.Errorf("cloned README: %q (%v)", b, err)
		}
		var smart bool
		for _, r := range site.Requests() {
			if r.Path == "/git/repo.git/git-upload-pack" {
				smart = true
			}
		}
		if !smart {
			t.Errorf("the clone never posted to git-upload-pack: not the smart protocol")
		}
	})
	t.Run("cert", func(t *testing.T) {
		c, err := tls.Dial("tcp", site.Addr.String(), n.CA().ClientConfig("site.test"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if got := c.ConnectionState().PeerCertificates[0]; site.Cert == nil || !got.Equal(site.Cert) {
			t.Errorf("Server.Cert is not the certificate the server presents")
		}
	})
}

func request(t *testing.T, method, url, host string, body io.Reader) *http.Request {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	return req
}

func do(t *testing.T, tr http.RoundTripper, method, url, host string, body io.Reader) *http.Response {
	t.Helper()
	resp, err := (&http.Client{Transport: tr}).Do(request(t, method, url, host, body))
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s %s: %s: %s", method, url, resp.Status, b)
	}
	return resp
}

// clientFrame writes a masked client frame, as RFC 6455 requires of clients.
func clientFrame(w *bufio.Writer, op byte, payload []byte) {
	hdr := []byte{0x80 | op}
	switch k := len(payload); {
	case k < 126:
		hdr = append(hdr, 0x80|byte(k))
	case k <= 0xffff:
		hdr = append(hdr, 0x80|126, byte(k>>8), byte(k))
	default:
		hdr = append(hdr, 0x80|127)
		hdr = binary.BigEndian.AppendUint64(hdr, uint64(k))
	}
	mask := []byte{1, 2, 3, 4}
	hdr = append(hdr, mask...)
	masked := make([]byte, len(payload))
	for i := range payload {
		masked[i] = payload[i] ^ mask[i%4]
	}
	w.Write(hdr)
	w.Write(masked)
	w.Flush()
}

// readServerFrame reads an unmasked server frame.
func readServerFrame(r *bufio.Reader) (op byte, fin bool, payload []byte, err error) {
	var h [2]byte
	if _, err = io.ReadFull(r, h[:]); err != nil {
		return
	}
	fin, op = h[0]&0x80 != 0, h[0]&0x0f
	size := uint64(h[1] & 0x7f)
	switch size {
	case 126:
		var b [2]byte
		io.ReadFull(r, b[:])
		size = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		io.ReadFull(r, b[:])
		size = binary.BigEndian.Uint64(b[:])
	}
	payload = make([]byte, size)
	_, err = io.ReadFull(r, payload)
	return
}
