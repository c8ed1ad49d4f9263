package config

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParsePolicies(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		want    map[string]Policy
		wantErr []string // substrings of the error
	}{
		{"inline", "[policies.corp]\nallow = [\"*.corp.example\"]\nblock = [\"bad.corp.example\"]\n",
			map[string]Policy{"corp": {Name: "corp", Allow: []string{"*.corp.example"}, Block: []string{"bad.corp.example"}, File: "/work/proj/moat.toml"}}, nil},
		{"url with default refresh", "[policies.ads]\nsource = \"https://lists.example/hosts.txt\"\n",
			map[string]Policy{"ads": {Name: "ads", Source: "https://lists.example/hosts.txt", Refresh: 24 * time.Hour, File: "/work/proj/moat.toml"}}, nil},
		{"relative path and refresh", "[policies.mine]\nsource = \"lists/block.txt\"\nrefresh = \"90m\"\n",
			map[string]Policy{"mine": {Name: "mine", Source: "/work/proj/lists/block.txt", Refresh: 90 * time.Minute, File: "/work/proj/moat.toml"}}, nil},
		{"redefine default", "[policies.default]\nallow = [\"a.example\"]\n", nil,
			[]string{"/work/proj/moat.toml:1:2: policies.default:", `"default" is built in and cannot be redefined`}},
		{"redefine none", "[policies.none]\nallow = [\"a.example\"]\n", nil, []string{"policies.none:", "built in"}},
		{"refresh too short", "[policies.ads]\nsource = \"https://l.example/x\"\nrefresh = \"30s\"\n", nil,
			[]string{"moat.toml:3:11: policies.ads.refresh:", "at least 1m", `"24h"`}},
		{"refresh not a duration", "[policies.ads]\nsource = \"https://l.example/x\"\nrefresh = \"daily\"\n", nil, []string{"policies.ads.refresh:"}},
		{"refresh without source", "[policies.ads]\nblock = [\"a.example\"]\nrefresh = \"1h\"\n", nil, []string{"policies.ads.refresh: refresh without a source"}},
		{"bad scheme", "[policies.ads]\nsource = \"ftp://l.example/x\"\n", nil, []string{"policies.ads.source:", "only http:// and https://"}},
		{"bad entry", "[policies.ads]\nblock = [\"ok.example\", \"http://x.example/\"]\n", nil, []string{"moat.toml:2:24: policies.ads.block[1]:", "a URL, not a rule"}},
		{"empty policy", "[policies.ads]\n", nil, []string{"policies.ads: an empty policy"}},
		{"bad name", "[policies.Ads]\nblock = [\"a.example\"]\n", nil, []string{"policy name \"Ads\""}},
		{"unknown key", "[policies.ads]\nsorce = \"x\"\n", nil, []string{`unknown key "policies.ads.sorce"`, "source", `did you mean "source"`}},
		{"wrong type", "[policies.ads]\nsource = [\"x\"]\n", nil, []string{"policies.ads.source: expected a string, got a list"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := parse(t, tt.doc)
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("no error; got %+v", f.Policies)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(f.Policies, tt.want) {
				t.Errorf("got  %+v\nwant %+v", f.Policies, tt.want)
			}
		})
	}
}

// TestMergePolicies: a policy defined in the user's file may be used by
// the project; the narrower file's definition replaces the wider one's
// whole; a name nobody defines is an error naming where it is used.
func TestMergePolicies(t *testing.T) {
	user := mustParse(t, "/home/u/.config/moat/config.toml", "[policies.ads]\nsource = \"https://l.example/a\"\n\n[policies.corp]\nallow = [\"*.corp.example\"]\n")
	project := mustParse(t, "/work/proj/moat.toml", "[network]\nuse = [\"default\", \"ads\", \"corp\"]\n\n[policies.corp]\nblock = [\"x.corp.example\"]\n")
	c := Merge(user, project)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	want := map[string]Policy{
		"ads":  {Name: "ads", Source: "https://l.example/a", Refresh: DefaultRefresh, File: "/home/u/.config/moat/config.toml"},
		"corp": {Name: "corp", Block: []string{"x.corp.example"}, File: "/work/proj/moat.toml"},
	}
	if !reflect.DeepEqual(c.Network.Policies, want) {
		t.Errorf("got  %+v\nwant %+v", c.Network.Policies, want)
	}

	bad := mustParse(t, "/work/proj/moat.toml", "[network]\nuse = [\n  \"default\",\n  \"adz\",\n]\n")
	err := Merge(user, bad).Validate()
	if err == nil {
		t.Fatal("an unknown policy validated")
	}
	for _, w := range []string{"/work/proj/moat.toml:4:3: network.use[1]:", `unknown policy "adz"`, "[policies.adz]", "default, none, ads, corp"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
}
