package preset

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

const testKey = "moat-ph-ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	m := map[string]any{}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return m
}

func TestMergeClaudeConfig(t *testing.T) {
	in := SeedInput{Dirs: []string{"/ws", "/ws/sub"}, Key: testKey, Version: "2.1.197"}
	old := `{"userID":"u1","theme":"light","lastOnboardingVersion":"1.0.0",
	  "customApiKeyResponses":{"approved":["other"],"rejected":["` + testKey[len(testKey)-20:] + `"]},
	  "projects":{"/ws":{"allowedTools":["Bash"]}}}`
	out, changed, err := MergeClaudeConfig([]byte(old), in)
	if err != nil || !changed {
		t.Fatalf("MergeClaudeConfig = %v, %v", changed, err)
	}
	m := decode(t, out)
	for k, want := range map[string]any{"userID": "u1", "theme": "light", "lastOnboardingVersion": "1.0.0",
		"hasCompletedOnboarding": true, "bypassPermissionsModeAccepted": true} {
		if m[k] != want {
			t.Errorf("%s = %v, want %v", k, m[k], want)
		}
	}
	resp := m["customApiKeyResponses"].(map[string]any)
	if got := stringList(resp["approved"]); !slices.Equal(got, []string{"other", testKey[len(testKey)-20:]}) {
		t.Errorf("approved = %q", got)
	}
	if got := stringList(resp["rejected"]); len(got) != 0 {
		t.Errorf("rejected = %q, want the key taken out", got)
	}
	projects := m["projects"].(map[string]any)
	ws := projects["/ws"].(map[string]any)
	if ws["hasTrustDialogAccepted"] != true || ws["allowedTools"] == nil {
		t.Errorf("projects[/ws] = %v, want trusted with its tools kept", ws)
	}
	if projects["/ws/sub"].(map[string]any)["hasTrustDialogAccepted"] != true {
		t.Errorf("projects[/ws/sub] not trusted")
	}
	// Merging again changes nothing.
	if again, changed, err := MergeClaudeConfig(out, in); err != nil || changed || string(again) != string(out) {
		t.Errorf("second merge: changed %v, err %v", changed, err)
	}
	// From nothing: the version is recorded.
	out, _, _ = MergeClaudeConfig(nil, in)
	if decode(t, out)["lastOnboardingVersion"] != "2.1.197" {
		t.Errorf("fresh config: %s", out)
	}
}

func TestSeedingRefusesRealValues(t *testing.T) {
	in := SeedInput{Key: "sk-ant-real-value-0123456789abcdef"}
	if _, _, err := MergeClaudeConfig(nil, in); !errors.Is(err, ErrNotPlaceholder) {
		t.Errorf("MergeClaudeConfig with a real key: %v, want ErrNotPlaceholder", err)
	}
	if _, _, err := MergeCodexAuth(nil, in); !errors.Is(err, ErrNotPlaceholder) {
		t.Errorf("MergeCodexAuth with a real key: %v, want ErrNotPlaceholder", err)
	}
}

func TestMergeClaudeSettings(t *testing.T) {
	out, changed, err := MergeClaudeSettings([]byte(`{"model":"opus","env":{"DISABLE_TELEMETRY":"0"}}`),
		SeedInput{Env: map[string]string{"DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1"}})
	if err != nil || !changed {
		t.Fatalf("MergeClaudeSettings = %v, %v", changed, err)
	}
	m := decode(t, out)
	env := m["env"].(map[string]any)
	if m["model"] != "opus" || m["skipDangerousModePermissionPrompt"] != true || env["DISABLE_TELEMETRY"] != "0" || env["DISABLE_AUTOUPDATER"] != "1" {
		t.Errorf("merged settings: %s", out)
	}
}

func TestMergeCodex(t *testing.T) {
	in := SeedInput{Dirs: []string{"/ws"}, Key: testKey}
	old := "model = \"o9\"\n[analytics]\nenabled = true\n[projects.\"/other\"]\ntrust_level = \"untrusted\"\n"
	out, changed, err := MergeCodexConfig([]byte(old), in)
	if err != nil || !changed {
		t.Fatalf("MergeCodexConfig = %v, %v", changed, err)
	}
	var m map[string]any
	if err := toml.Unmarshal(out, &m); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	projects := m["projects"].(map[string]any)
	if m["model"] != "o9" || m["analytics"].(map[string]any)["enabled"] != true || m["check_for_update_on_startup"] != false ||
		projects["/ws"].(map[string]any)["trust_level"] != "trusted" || projects["/other"].(map[string]any)["trust_level"] != "untrusted" {
		t.Errorf("merged config.toml:\n%s", out)
	}
	if _, changed, _ := MergeCodexConfig(out, in); changed {
		t.Error("second merge changed config.toml")
	}

	auth, changed, err := MergeCodexAuth(nil, in)
	if err != nil || !changed || decode(t, auth)["OPENAI_API_KEY"] != testKey || decode(t, auth)["auth_mode"] != "apikey" {
		t.Errorf("MergeCodexAuth(nil) = %s, %v, %v", auth, changed, err)
	}
	login := []byte(`{"auth_mode":"chatgpt","tokens":{"id_token":"x"}}`)
	if got, changed, _ := MergeCodexAuth(login, in); changed || string(got) != string(login) {
		t.Errorf("MergeCodexAuth replaced the user's login: %s", got)
	}
}

func TestMergeBadFiles(t *testing.T) {
	if _, _, err := MergeClaudeConfig([]byte("{not json"), SeedInput{}); err == nil || !strings.Contains(err.Error(), ".claude.json") {
		t.Errorf("bad .claude.json: %v, want an error naming the file", err)
	}
	if _, _, err := MergeCodexConfig([]byte("= ="), SeedInput{}); err == nil || !strings.Contains(err.Error(), "config.toml") {
		t.Errorf("bad config.toml: %v, want an error naming the file", err)
	}
}

func TestNewerThan(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"2.1.198", "2.1.197", true},
		{"2.1.197", "2.1.197", false},
		{"2.1.10", "2.1.9", true},
		{"2.2.0", "2.10.0", false},
		{"0.172.0-alpha.1", "0.171.0", true},
		{"v1.0.1", "1.0.0", true},
		{"", "1.0.0", false},
	}
	for _, tt := range tests {
		if got := NewerThan(tt.a, tt.b); got != tt.want {
			t.Errorf("NewerThan(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}
