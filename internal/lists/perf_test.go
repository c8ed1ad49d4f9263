package lists

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/policy"
)

// genList writes a list of n lines in format f, every name distinct, in
// the shape real lists have (a few labels, mixed length).
func genList(f Format, n int) []byte {
	var b strings.Builder
	b.Grow(n * 40)
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("ads%d.tracker%d.example%d.test", i, i%977, i%13)
		switch f {
		case FormatHosts:
			b.WriteString("0.0.0.0 " + name + "\n")
		case FormatDomains:
			b.WriteString(name + "\n")
		case FormatAdblock:
			b.WriteString("||" + name + "^\n")
		}
	}
	return []byte(b.String())
}

// compile is what the daemon does with a loaded list: entries to rules
// of the named layer, then one compiled policy.
func compile(p *Parsed) *policy.Policy {
	return policy.Compile(p.Rules(policy.LayerNamed, "policy big"))
}

func heapMiB() float64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapAlloc) / (1 << 20)
}

// TestLoadBigList: a 100 000-line list in each format is parsed and
// compiled whole, holds under 30 MiB, and its entries deny. How long the
// load takes is BenchmarkLoad's to say: on a shared machine a time bound
// here fails for the machine's load, not for the code.
func TestLoadBigList(t *testing.T) {
	const lines = 100_000
	for _, f := range []Format{FormatHosts, FormatDomains, FormatAdblock} {
		t.Run(f.String(), func(t *testing.T) {
			data := genList(f, lines)
			before := heapMiB()
			start := time.Now()
			p := Parse(data)
			pol := compile(p)
			took := time.Since(start)
			data = nil
			cost := heapMiB() - before
			t.Logf("%s: %d lines, %d entries, %v, %.1f MiB", f, lines, p.Entries(), took, cost)
			if p.RejectedCount+p.UnsupportedCount != 0 || p.Formats[f] != lines {
				t.Fatalf("rejected %d unsupported %d formats %v", p.RejectedCount, p.UnsupportedCount, p.Formats)
			}
			if cost > 30 {
				t.Errorf("the loaded list holds %.1f MiB, want under 30", cost)
			}
			name := fmt.Sprintf("ads%d.tracker%d.example%d.test", 4242, 4242%977, 4242%13)
			if d := pol.Name(name, 443); d.Verdict != policy.Deny || d.Rule == nil {
				t.Errorf("%s: %v by %v, want a deny by the list", name, d.Verdict, d.Rule)
			}
			runtime.KeepAlive(pol)
			runtime.KeepAlive(p)
		})
	}
}

// BenchmarkLoad is parse + compile of a 100 000-line list per format;
// run with: go test ./internal/lists -bench Load -benchmem
func BenchmarkLoad(b *testing.B) {
	for _, f := range []Format{FormatHosts, FormatDomains, FormatAdblock} {
		data := genList(f, 100_000)
		b.Run(f.String(), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				compile(Parse(data))
			}
		})
	}
}
