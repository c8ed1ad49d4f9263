package config

import (
	"strings"
	"testing"
	"time"
)

func TestAuditKeys(t *testing.T) {
	user := mustParse(t, "/home/u/.config/moat/config.toml", "[audit]\nmax_size = \"512MiB\"\nretention = \"30d\"\n")
	project := mustParse(t, "/work/p/moat.toml", "[audit]\nretention = \"36h\"\n")
	got := Merge(user, project).Audit
	if want := (Audit{MaxBytes: 512 << 20, Retention: 36 * time.Hour}); got != want {
		t.Fatalf("merged %+v, want %+v", got, want)
	}
	if got := Merge().Audit; got != (Audit{}) {
		t.Fatalf("no file: %+v, want zero (the audit package's defaults)", got)
	}
}

func TestAuditKeyErrors(t *testing.T) {
	for _, tt := range []struct{ doc, want string }{
		{"[audit]\nmax_size = \"100KiB\"", `moat.toml:2:12: audit.max_size: "100KiB" is less than the minimum of 1MiB`},
		{"[audit]\nmax_size = 5", `moat.toml:2:12: audit.max_size: expected a size string`},
		{"[audit]\nmax_size = \"lots\"", `moat.toml:2:12: audit.max_size: "lots" is not a size`},
		{"[audit]\nretention = \"a week\"", `moat.toml:2:13: audit.retention: "a week" is not a duration; write e.g. "7d"`},
		{"[audit]\nretention = \"10s\"", `moat.toml:2:13: audit.retention: "10s" is shorter than the minimum of 1m`},
		{"[audit]\nkeep = 3", `moat.toml:2:1: unknown key "audit.keep"; known keys in [audit]: max_size, retention`},
	} {
		_, err := Parse("moat.toml", []byte(tt.doc))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: got %v, want %q", tt.doc, err, tt.want)
		}
	}
}
