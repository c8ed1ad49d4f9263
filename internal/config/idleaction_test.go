package config

import (
	"strings"
	"testing"
)

func TestIdleAction(t *testing.T) {
	for _, tc := range []struct {
		doc, want, err string
	}{
		{`sandbox.idle_action = "suspend"`, IdleSuspend, ""},
		{`sandbox.idle_action = "stop"`, IdleStop, ""},
		{``, "", ""},
		{`sandbox.idle_action = "park"`, "", `sandbox.idle_action: unknown idle action "park"; write "suspend"`},
		{`sandbox.idle_action = true`, "", "sandbox.idle_action"},
	} {
		f, err := parse(t, tc.doc)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "moat.toml") {
				t.Errorf("%s: err %v; want one naming the file and %q", tc.doc, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.doc, err)
			continue
		}
		c := Merge(f)
		if c.Sandbox.IdleAction != tc.want {
			t.Errorf("%s: idle action %q, want %q", tc.doc, c.Sandbox.IdleAction, tc.want)
		}
	}
}
