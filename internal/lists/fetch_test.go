package lists

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// server is a list server on loopback that honours If-None-Match and
// If-Modified-Since, and can be told to fail.
type server struct {
	*httptest.Server
	body     atomic.Value // string
	etag     atomic.Value // string; "" sends none
	lastMod  atomic.Value // string; "" sends none
	fail     atomic.Bool
	gets     atomic.Int64
	notMod   atomic.Int64
	lastCond atomic.Value // string: the conditional headers of the last request
}

func newServer(t *testing.T, body, etag, lastMod string) *server {
	s := &server{}
	s.body.Store(body)
	s.etag.Store(etag)
	s.lastMod.Store(lastMod)
	s.lastCond.Store("")
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.gets.Add(1)
		s.lastCond.Store(r.Header.Get("If-None-Match") + "|" + r.Header.Get("If-Modified-Since"))
		if s.fail.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		etag, lm := s.etag.Load().(string), s.lastMod.Load().(string)
		if etag != "" && r.Header.Get("If-None-Match") == etag || etag == "" && lm != "" && r.Header.Get("If-Modified-Since") == lm {
			s.notMod.Add(1)
			w.WriteHeader(http.StatusNotModified)
			return
		}
		if etag != "" {
			w.Header().Set("ETag", etag)
		}
		if lm != "" {
			w.Header().Set("Last-Modified", lm)
		}
		w.Write([]byte(s.body.Load().(string)))
	}))
	t.Cleanup(s.Close)
	return s
}

func TestRefreshETag(t *testing.T) {
	s := newServer(t, "0.0.0.0 a.example\n", `"v1"`, "")
	c := &Cache{Dir: t.TempDir()}
	ctx := context.Background()
	steps := []struct {
		do          func()
		wantChanged bool
		wantCond    string
		wantBlock   string
	}{
		{func() {}, true, "|", "a.example"},
		{func() {}, false, `"v1"|`, "a.example"},
		{func() { s.body.Store("0.0.0.0 b.example\n"); s.etag.Store(`"v2"`) }, true, `"v1"|`, "b.example"},
		{func() {}, false, `"v2"|`, "b.example"},
	}
	for i, st := range steps {
		st.do()
		changed, err := c.Refresh(ctx, s.URL+"/list")
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if changed != st.wantChanged || s.lastCond.Load() != st.wantCond {
			t.Fatalf("step %d: changed %v cond %q, want %v %q", i, changed, s.lastCond.Load(), st.wantChanged, st.wantCond)
		}
		data, m, err := c.Read(s.URL + "/list")
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(Parse(data).Block, " "); got != st.wantBlock {
			t.Fatalf("step %d: cached %q, want %q", i, got, st.wantBlock)
		}
		if m.Fetched.IsZero() || m.Source != s.URL+"/list" {
			t.Fatalf("step %d: meta %+v", i, m)
		}
	}
	if s.notMod.Load() != 2 {
		t.Fatalf("304s: %d, want 2", s.notMod.Load())
	}
}

func TestRefreshLastModified(t *testing.T) {
	lm := "Wed, 02 Dec 2026 10:00:00 GMT"
	s := newServer(t, "x.example\n", "", lm)
	now := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	c := &Cache{Dir: t.TempDir(), Now: func() time.Time { return now }}
	if _, err := c.Refresh(context.Background(), s.URL); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Hour)
	changed, err := c.Refresh(context.Background(), s.URL)
	if err != nil || changed || s.lastCond.Load() != "|"+lm {
		t.Fatalf("changed %v err %v cond %q", changed, err, s.lastCond.Load())
	}
	m, _ := c.Meta(s.URL)
	if !m.Fetched.Equal(now) || m.LastModified != lm {
		t.Fatalf("a 304 must move Fetched and keep the validator: %+v", m)
	}
}

// TestLoadKeepsLastGoodCopy: a refresh that fails keeps the copy and
// says so; the warning goes away once a refresh works again.
func TestLoadKeepsLastGoodCopy(t *testing.T) {
	s := newServer(t, "||ads.example^\n", `"v1"`, "")
	now := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	c := &Cache{Dir: t.TempDir(), Now: func() time.Time { return now }}
	ctx := context.Background()
	l := c.Load(ctx, "ads", s.URL, 24*time.Hour, true)
	if len(l.Warnings) != 0 || l.Parsed.Entries() != 2 || !l.Fetched.Equal(now) {
		t.Fatalf("first load: %+v", l)
	}
	// Fresh enough: no request at all.
	before := s.gets.Load()
	c.Load(ctx, "ads", s.URL, 24*time.Hour, true)
	if s.gets.Load() != before {
		t.Fatal("a fresh copy was fetched again")
	}
	s.fail.Store(true)
	now = now.Add(25 * time.Hour)
	l = c.Load(ctx, "ads", s.URL, 24*time.Hour, true)
	if l.Parsed.Entries() != 2 || len(l.Warnings) != 1 || !strings.Contains(l.Warnings[0], "503") || !strings.Contains(l.Warnings[0], "using the copy fetched") {
		t.Fatalf("failed refresh: %+v", l)
	}
	// Loading without fetching still reports the failed refresh.
	if l := c.Load(ctx, "ads", s.URL, 24*time.Hour, false); len(l.Warnings) != 1 || l.Parsed.Entries() != 2 {
		t.Fatalf("cached load after a failure: %+v", l)
	}
	s.fail.Store(false)
	if l := c.Load(ctx, "ads", s.URL, 24*time.Hour, true); len(l.Warnings) != 0 {
		t.Fatalf("after recovery: %v", l.Warnings)
	}
}

func TestLoadNeverFetched(t *testing.T) {
	// A port nobody listens on: bind one, then close it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String() + "/list?token=s3cr3t"
	ln.Close()
	c := &Cache{Dir: t.TempDir()}
	l := c.Load(context.Background(), "ads", url, time.Hour, true)
	if l.Parsed == nil || l.Parsed.Entries() != 0 || len(l.Warnings) != 1 {
		t.Fatalf("%+v", l)
	}
	w := l.Warnings[0]
	for _, want := range []string{`policy "ads"`, "never been fetched", "EMPTY", "moat policy refresh ads"} {
		if !strings.Contains(w, want) {
			t.Errorf("warning %q lacks %q", w, want)
		}
	}
	if strings.Contains(w, "s3cr3t") {
		t.Errorf("warning shows the URL's query: %q", w)
	}
	if l := c.Load(context.Background(), "ads", url, time.Hour, false); len(l.Warnings) != 1 || !strings.Contains(l.Warnings[0], "never been fetched") {
		t.Fatalf("without fetching: %+v", l.Warnings)
	}
}

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "list.txt")
	os.WriteFile(p, []byte("0.0.0.0 a.example\nnot a list line\n"), 0o644)
	c := &Cache{Dir: filepath.Join(dir, "cache")}
	l := c.Load(context.Background(), "mine", p, time.Hour, true)
	if l.Parsed.Entries() != 1 || len(l.Warnings) != 1 || !strings.Contains(l.Warnings[0], "1 of 2 lines") || !strings.Contains(l.Warnings[0], "line 2") {
		t.Fatalf("%+v", l)
	}
	if _, err := os.Stat(c.Dir); err == nil {
		t.Fatal("a file source was cached")
	}
	l = c.Load(context.Background(), "gone", filepath.Join(dir, "nope"), time.Hour, true)
	if l.Parsed.Entries() != 0 || len(l.Warnings) != 1 || !strings.Contains(l.Warnings[0], "no such file") {
		t.Fatalf("%+v", l)
	}
}

func TestFetchBounded(t *testing.T) {
	big := strings.Repeat("a.example\n", MaxBytes/10+1)
	s := newServer(t, big, "", "")
	c := &Cache{Dir: t.TempDir()}
	if _, err := c.Refresh(context.Background(), s.URL); err == nil || !strings.Contains(err.Error(), "larger than 64 MiB") {
		t.Fatalf("err %v", err)
	}
	if _, _, err := c.Read(s.URL); err != ErrNeverFetched {
		t.Fatalf("an oversized list was cached: %v", err)
	}
}

func TestRemove(t *testing.T) {
	s := newServer(t, "a.example\n", "", "")
	c := &Cache{Dir: t.TempDir()}
	if _, err := c.Refresh(context.Background(), s.URL); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(s.URL); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Read(s.URL); err != ErrNeverFetched {
		t.Fatalf("after Remove: %v", err)
	}
	if err := c.Remove(s.URL); err != nil {
		t.Fatalf("removing twice: %v", err)
	}
}
