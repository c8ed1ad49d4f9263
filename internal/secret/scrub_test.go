package secret

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/config"
)

// chunkReader returns at most n bytes per Read, or the sizes in sizes in
// turn, so every way a body can be cut into reads is reachable.
type chunkReader struct {
	data  []byte
	n     int
	sizes []int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := r.n
	if len(r.sizes) > 0 {
		n, r.sizes = r.sizes[0], r.sizes[1:]
	}
	n = min(n, len(p), len(r.data))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

func (r *chunkReader) Close() error { return nil }

func scrubAll(t testing.TB, s *Set, r io.ReadCloser) string {
	t.Helper()
	b, err := io.ReadAll(s.ScrubBody(r))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// echoForms is a body an echoing server might send back after a
// request that carried v in a header, in basic auth and in a query.
func echoForms(v string) string {
	hj, _ := json.Marshal(map[string]string{"X-Api-Key": v, "Note": "<" + v + ">"})
	var b strings.Builder
	b.WriteString("plain " + v + " twice " + v + v + "\n")
	b.WriteString(string(hj) + "\n")
	b.WriteString(`{"php":"` + strings.ReplaceAll(v, "/", `\/`) + `"}` + "\n")
	b.WriteString("url https://h.example/get?key=" + url.QueryEscape(v) + "&p=/" + url.PathEscape(v) + "\n")
	b.WriteString("Authorization: " + basic("x-access-token:"+v) + "\n")
	b.WriteString("bare basic " + base64.StdEncoding.EncodeToString([]byte(v)) + "\n")
	b.WriteString("jwt-ish " + base64.RawURLEncoding.EncodeToString([]byte(`{"k":"`+v+`","n":1}`)) + "\n")
	b.WriteString("prefix of it " + v[:len(v)-1] + " end\n")
	return b.String()
}

func TestScrubString(t *testing.T) {
	s := mustResolve(t, testSecrets(), testEnv())
	ph := s.Placeholders()["API_KEY"]
	tests := []struct{ in, want string }{
		{canary, ph},
		{"a" + canary + "b" + canary, "a" + ph + "b" + ph},
		{`{"X-Api-Key":"` + canary + `"}`, `{"X-Api-Key":"` + ph + `"}`},
		{`{"k":"` + strings.ReplaceAll(canary, "/", `\/`) + `"}`, `{"k":"` + ph + `"}`},
		{"?key=" + url.QueryEscape(canary), "?key=" + ph},
		{"/" + url.PathEscape(canary), "/" + ph},
		{canary[:len(canary)-1], canary[:len(canary)-1]}, // not the value
		{"nothing here", "nothing here"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := s.ScrubString(tt.in); got != tt.want {
			t.Errorf("ScrubString(%q)\n got  %q\n want %q", tt.in, got, tt.want)
		}
	}
	h := http.Header{"X-Echo": {"Bearer " + canary, otherValue}, "Y": {"ok"}}
	s.ScrubHeader(h)
	if got, want := h["X-Echo"], []string{"Bearer " + ph, s.Placeholders()["GH_TOKEN"]}; got[0] != want[0] || got[1] != want[1] || h.Get("Y") != "ok" {
		t.Errorf("ScrubHeader: %q, want %q", h, want)
	}
}

// TestScrubBasic checks that an echoed Basic credential decodes to
// user:placeholder for every user length, that is every alignment of
// the value in the base64 stream.
func TestScrubBasic(t *testing.T) {
	s := mustResolve(t, testSecrets(), testEnv())
	for _, v := range []string{canary, otherValue} {
		ph := s.ScrubString(v)
		for _, user := range []string{"", "u", "us", "use", "user", "x-access-token", "x-access-token1"} {
			in := "Authorization: " + basic(user+":"+v)
			if got, want := s.ScrubString(in), "Authorization: "+basic(user+":"+ph); got != want {
				t.Errorf("user %q: got %q, want %q", user, got, want)
			}
		}
	}
}

// TestScrubBase64Anywhere checks that a value inside any base64 text, at
// any alignment and with anything around it, cannot be read back, not
// even its first or last bytes.
func TestScrubBase64Anywhere(t *testing.T) {
	s := mustResolve(t, testSecrets(), testEnv())
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding} {
		for pre := range 6 {
			for post := range 4 {
				plain := strings.Repeat("p", pre) + canary + strings.Repeat("q", post)
				scrubbed := s.ScrubString(enc.EncodeToString([]byte(plain)))
				dec, err := enc.DecodeString(scrubbed)
				if err != nil {
					t.Errorf("pre %d post %d: scrubbed base64 does not decode: %v", pre, post, err)
					continue
				}
				for i := 0; i+4 <= len(canary); i++ {
					if bytes.Contains(dec, []byte(canary[i:i+4])) {
						t.Errorf("pre %d post %d: decoded %q still holds %q", pre, post, dec, canary[i:i+4])
						break
					}
				}
			}
		}
	}
}

// TestScrubBodySplits reads the same body cut into reads of every size
// and at every single split point: the output is always what
// ScrubString gives for the whole, and never holds the value.
func TestScrubBodySplits(t *testing.T) {
	s := mustResolve(t, testSecrets(), testEnv())
	body := echoForms(canary) + echoForms(otherValue)
	want := s.ScrubString(body)
	if strings.Contains(want, canary) || strings.Contains(want, otherValue) {
		t.Fatalf("ScrubString leaves a value:\n%s", want)
	}
	for n := 1; n <= len(body); n++ {
		if got := scrubAll(t, s, &chunkReader{data: []byte(body), n: n}); got != want {
			t.Fatalf("reads of %d bytes:\n got  %q\n want %q", n, got, want)
		}
	}
	for i := 0; i <= len(body); i++ {
		if got := scrubAll(t, s, &chunkReader{data: []byte(body), sizes: []int{i, len(body)}}); got != want {
			t.Fatalf("split at %d:\n got  %q\n want %q", i, got, want)
		}
	}
}

// stepReader hands out the chunks sent on c, one per Read, and io.EOF
// when c is closed: a server that sends an event and then waits.
type stepReader struct{ c chan string }

func (r *stepReader) Read(p []byte) (int, error) {
	s, ok := <-r.c
	if !ok {
		return 0, io.EOF
	}
	return copy(p, s), nil
}

func (r *stepReader) Close() error { return nil }

// TestScrubBodyDoesNotDelay checks that what arrived is returned before
// the source is read again, except the bytes that may begin a value, and
// that those are never more than the longest form less one.
func TestScrubBodyDoesNotDelay(t *testing.T) {
	s := mustResolve(t, testSecrets(), testEnv())
	ph := s.Placeholders()["API_KEY"]
	src := &stepReader{c: make(chan string, 1)}
	body := s.ScrubBody(src)
	maxHold := s.scrubber().maxHold()

	read := func() string {
		t.Helper()
		type res struct {
			s   string
			err error
		}
		done := make(chan res, 1)
		go func() {
			b := make([]byte, 64<<10)
			n, err := body.Read(b)
			done <- res{string(b[:n]), err}
		}()
		select {
		case r := <-done:
			if r.err != nil {
				t.Fatalf("Read: %v", r.err)
			}
			return r.s
		case <-time.After(5 * time.Second):
			t.Fatal("Read held back bytes that cannot start a value")
			return ""
		}
	}
	steps := []struct{ send, want string }{
		{"data: one\n\n", "data: one\n\n"},
		{"data: " + canary + "\n\n", "data: " + ph + "\n\n"},
		{"data: " + canary + ".", "data: " + ph + "."}, // whole, and no form starts with "."
		{"!" + canary[:10], "!"},                       // may be the start of the value: held
		{canary[10:] + "\n\n", ph + "\n\n"},
		{strings.Repeat(" ", 100) + canary[:len(canary)-1], strings.Repeat(" ", 100)},
		{"!", canary[:len(canary)-1] + "!"},
	}
	for _, st := range steps {
		src.c <- st.send
		if got := read(); got != st.want {
			t.Fatalf("after %q: Read = %q, want %q", st.send, got, st.want)
		}
	}
	// However a body ends, no more than maxHold bytes wait.
	long := strings.Repeat(canary[:5], 100)
	src.c <- long
	if got := read(); len(long)-len(got) > maxHold {
		t.Errorf("held %d bytes, more than %d", len(long)-len(got), maxHold)
	}
	close(src.c)
	rest, err := io.ReadAll(body)
	if err != nil || !strings.HasSuffix(long, string(rest)) {
		t.Errorf("rest = %q, %v", rest, err)
	}
}

// TestScrubBodyError checks that on a failing source the held bytes,
// which may be the start of a value, are dropped.
func TestScrubBodyError(t *testing.T) {
	s := mustResolve(t, testSecrets(), testEnv())
	boom := errors.New("connection reset")
	r := io.NopCloser(io.MultiReader(strings.NewReader("ok "+canary[:20]), &failReader{boom}))
	got, err := io.ReadAll(s.ScrubBody(r))
	if !errors.Is(err, boom) || string(got) != "ok " {
		t.Errorf("got %q, %v; want \"ok \", %v", got, err, boom)
	}
}

type failReader struct{ err error }

func (r *failReader) Read([]byte) (int, error) { return 0, r.err }

func TestScrubNothing(t *testing.T) {
	s := mustResolve(t, nil, nil)
	r := io.NopCloser(strings.NewReader("x"))
	if s.Scrubs() || s.ScrubBody(r) != r || s.ScrubString("x") != "x" {
		t.Errorf("an empty set changes bodies")
	}
}

// TestRefreshScrubsRetired checks that a refreshed value is swapped in,
// and that the value it replaced is still scrubbed.
func TestRefreshScrubsRetired(t *testing.T) {
	e := testEnv()
	s := mustResolve(t, testSecrets(), e)
	ph := s.Placeholders()
	if changed, err := s.Refresh(t.Context(), env(e)); err != nil || len(changed) != 0 {
		t.Fatalf("Refresh with the same values = %v, %v; want nothing changed", changed, err)
	}
	e["API_KEY"] = "sk-rotated-value-000000000"
	if changed, err := s.Refresh(t.Context(), env(e)); err != nil || strings.Join(changed, ",") != "API_KEY" {
		t.Fatalf("Refresh = %v, %v; want API_KEY changed", changed, err)
	}
	if got := s.Placeholders(); got["API_KEY"] != ph["API_KEY"] {
		t.Errorf("placeholder changed on refresh")
	}
	h := http.Header{"X-Api-Key": {ph["API_KEY"]}}
	if _, err := s.Request("api.example.com", h, nil); err != nil || h.Get("X-Api-Key") != e["API_KEY"] {
		t.Errorf("after refresh swapped %q, %v", h.Get("X-Api-Key"), err)
	}
	if got := s.ScrubString(canary + " " + e["API_KEY"]); got != ph["API_KEY"]+" "+ph["API_KEY"] {
		t.Errorf("ScrubString after refresh = %q", got)
	}
	// A failed refresh changes nothing.
	delete(e, "GH")
	if _, err := s.Refresh(t.Context(), env(e)); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Refresh = %v, want ErrUnavailable", err)
	}
	h = http.Header{"Authorization": {"Bearer " + ph["GH_TOKEN"]}}
	if _, err := s.Request("github.com", h, nil); err != nil || h.Get("Authorization") != "Bearer "+otherValue {
		t.Errorf("after failed refresh: %q, %v", h.Get("Authorization"), err)
	}
}

// TestEcho sends requests through Request to a local server that echoes
// what it received (headers as JSON, the URL, the Authorization header
// in its own header) and reads the answers through ScrubHeader and
// ScrubBody, as the gate does: the server sees the value, the client
// sees placeholders only.
func TestEcho(t *testing.T) {
	secrets := testSecrets()
	secrets["GIT"] = config.Secret{Name: "GIT", From: "env:GIT", Hosts: []string{"127.0.0.1.nip.test"}, Header: "authorization"}
	e := testEnv()
	e["GIT"] = "git+token/with=odd&chars"
	s := mustResolve(t, secrets, e)
	var received []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		received = append(received, r.Header.Get("X-Api-Key"), r.Header.Get("Authorization"), r.URL.Query().Get("key"))
		w.Header().Set("X-Echo-Auth", r.Header.Get("Authorization"))
		w.Header().Set("X-Echo-Key", r.Header.Get("X-Api-Key"))
		json.NewEncoder(w).Encode(map[string]any{"headers": r.Header, "url": r.URL.String()}) //nolint:errcheck
	}))
	defer srv.Close()

	ph := s.Placeholders()
	tests := []struct {
		host   string
		header http.Header
		query  string
		want   string // what the server must have received
	}{
		{"api.example.com", http.Header{"X-Api-Key": {ph["API_KEY"]}}, "", canary},
		{"maps.example.com", nil, "key=" + ph["MAPS_KEY"], e["MAPS"]},
		{"127.0.0.1.nip.test", http.Header{"Authorization": {basic("x-access-token:" + ph["GIT"])}}, "", basic("x-access-token:" + e["GIT"])},
	}
	for _, tt := range tests {
		received = nil
		req, err := http.NewRequest("GET", srv.URL+"/echo?"+tt.query, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range tt.header {
			req.Header[k] = v
		}
		if _, err := s.Request(tt.host, req.Header, req.URL); err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		s.ScrubHeader(resp.Header)
		body := scrubAll(t, s, resp.Body)
		if !strings.Contains(strings.Join(received, " "), tt.want) {
			t.Errorf("%s: server received %q, want %q among them", tt.host, received, tt.want)
		}
		seen := body + " " + resp.Header.Get("X-Echo-Auth") + " " + resp.Header.Get("X-Echo-Key")
		for _, v := range e {
			for _, form := range []string{v, url.QueryEscape(v), base64.StdEncoding.EncodeToString([]byte("x-access-token:" + v))} {
				if strings.Contains(seen, form) {
					t.Errorf("%s: the client sees %q in\n%s", tt.host, form, seen)
				}
			}
		}
	}
}

// FuzzScrubBody embeds the value in random data, cuts it into random
// reads and checks the stream against the one-shot result.
func FuzzScrubBody(f *testing.F) {
	s := mustResolve(f, testSecrets(), testEnv())
	f.Add([]byte("hello world"), uint16(3), uint64(1))
	f.Add([]byte(canary[:20]), uint16(0), uint64(7))
	f.Add([]byte(echoForms(canary)), uint16(100), uint64(42))
	f.Fuzz(func(t *testing.T, data []byte, at uint16, seed uint64) {
		i := int(at) % (len(data) + 1)
		body := append(append(append([]byte{}, data[:i]...), canary...), data[i:]...)
		want := s.ScrubString(string(body))
		// Placeholders masked: one whose last byte is the value's first,
		// followed by the rest of a value the data cut in two (which no
		// scrubbing of whole values can match), would spell the value
		// without any of it having been left in.
		masked := want
		for _, ph := range s.Placeholders() {
			masked = strings.ReplaceAll(masked, ph, "\x00")
		}
		if strings.Contains(masked, canary) {
			t.Fatalf("ScrubString leaves the value in %q", want)
		}
		rng := rand.New(rand.NewPCG(seed, seed))
		var sizes []int
		for n := 0; n < len(body); {
			k := rng.IntN(len(canary)*2) + 1
			sizes = append(sizes, k)
			n += k
		}
		if got := scrubAll(t, s, &chunkReader{data: body, sizes: sizes, n: len(body)}); got != want {
			t.Fatalf("sizes %v:\n got  %q\n want %q", sizes, got, want)
		}
	})
}

// benchBody is 16 MiB of JSON-like text with a value every 64 KiB.
func benchBody(b *testing.B) []byte {
	b.Helper()
	var buf bytes.Buffer
	rng := rand.New(rand.NewPCG(1, 2))
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 {}\":,\n"
	line := make([]byte, 1024)
	for buf.Len() < 16<<20 {
		for i := range line {
			line[i] = letters[rng.IntN(len(letters))]
		}
		buf.Write(line)
		if buf.Len()%(64<<10) < 1024 {
			buf.WriteString(canary)
		}
	}
	return buf.Bytes()
}

// BenchmarkScrubBody compares a body read through ScrubBody with the
// same body copied as is; the MB/s of each are the figures to compare.
func BenchmarkScrubBody(b *testing.B) {
	body := benchBody(b)
	s := mustResolve(b, testSecrets(), testEnv())
	b.Run("scrub", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, err := io.Copy(io.Discard, s.ScrubBody(io.NopCloser(bytes.NewReader(body)))); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			// A reader without WriteTo, as a response body is, so that
			// io.Copy goes through a 32 KiB buffer like the scrubber.
			if _, err := io.Copy(io.Discard, struct{ io.Reader }{bytes.NewReader(body)}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
