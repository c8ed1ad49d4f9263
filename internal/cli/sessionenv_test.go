package cli

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"moat.dev/moat/internal/config"
)

func TestConfigEnv(t *testing.T) {
	host := map[string]string{"HOST_DB": "postgres://h/db", "EDITOR": "vi", "EMPTY": ""}
	lookup := func(k string) (string, bool) { v, ok := host[k]; return v, ok }
	tests := []struct {
		name string
		vars []config.EnvVar
		want map[string]string
		err  string
	}{
		{"literal and defaults", []config.EnvVar{
			{Name: "MODE", Value: "dev"},
			{Name: "DB", Value: "${HOST_DB:-sqlite://}"},
			{Name: "LEVEL", Value: "${NOPE:-info}"},
			{Name: "COST", Value: "$$5"},
		}, map[string]string{"MODE": "dev", "DB": "postgres://h/db", "LEVEL": "info", "COST": "$5"}, ""},
		{"pass", []config.EnvVar{{Name: "EDITOR", Pass: true}, {Name: "PAGER", Pass: true}, {Name: "EMPTY", Pass: true}},
			map[string]string{"EDITOR": "vi", "EMPTY": ""}, ""},
		{"required missing", []config.EnvVar{{Name: "DB", Value: "${NOPE:?set NOPE on the host}"}}, nil,
			"[env] DB: NOPE: set NOPE on the host"},
		{"required empty", []config.EnvVar{{Name: "E", Value: "${EMPTY:?}"}}, nil, "[env] E: EMPTY: EMPTY is not set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := configEnv(config.Config{EnvVars: tt.vars}, lookup)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				var ee *exitError
				if !errors.As(err, &ee) || ee.code != ExitUsage {
					t.Errorf("err %#v: want exit code %d", err, ExitUsage)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 5 << 20: "5.0 MiB", 3 << 30: "3.0 GiB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
