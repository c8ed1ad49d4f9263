package secret

import (
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"moat.dev/moat/internal/config"
)

func basic(userpass string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(userpass))
}

func TestRequest(t *testing.T) {
	secrets := testSecrets()
	secrets["STRICT"] = config.Secret{Name: "STRICT", From: "env:STRICT", Hosts: []string{"strict.example.com"}, Header: "Authorization", Require: true}
	secrets["LOOSE"] = config.Secret{Name: "LOOSE", From: "env:LOOSE", Hosts: []string{"strict.example.com"}, Header: "X-Second"}
	secrets["ANYREQ"] = config.Secret{Name: "ANYREQ", From: "env:ANYREQ", Hosts: []string{"anyreq.example.com"}, Require: true, Query: "token"}
	e := testEnv()
	e["STRICT"] = "strict-value-0123456789"
	e["LOOSE"] = "loose-value-0123456789"
	e["ANYREQ"] = "anyreq-value-0123456789"
	s := mustResolve(t, secrets, e)
	ph := s.Placeholders()
	api, gh, maps, strict, loose, anyreq := ph["API_KEY"], ph["GH_TOKEN"], ph["MAPS_KEY"], ph["STRICT"], ph["LOOSE"], ph["ANYREQ"]
	mapsEsc := url.QueryEscape(e["MAPS"])

	type hdr = http.Header
	tests := []struct {
		name      string
		host      string
		h         hdr
		query     string
		wantH     hdr // without Accept-Encoding, which is checked apart
		wantQuery string
		applied   Applied
		wantErr   string // substring of a RequiredError
	}{
		{"configured header", "api.example.com",
			hdr{"X-Api-Key": {api}, "User-Agent": {"curl " + api}}, "",
			hdr{"X-Api-Key": {canary}, "User-Agent": {"curl " + api}}, "",
			Applied{"API_KEY:header:x-api-key"}, ""},
		{"any header, as a substring", "api.github.com",
			hdr{"Authorization": {"Bearer " + gh}, "X-Other": {"a " + gh + " b " + gh}}, "",
			hdr{"Authorization": {"Bearer " + otherValue}, "X-Other": {"a " + otherValue + " b " + otherValue}}, "",
			Applied{"GH_TOKEN:header:authorization", "GH_TOKEN:header:x-other"}, ""},
		{"basic auth, as git sends it", "github.com:443",
			hdr{"Authorization": {basic("x-access-token:" + gh)}}, "",
			hdr{"Authorization": {basic("x-access-token:" + otherValue)}}, "",
			Applied{"GH_TOKEN:basic:authorization"}, ""},
		{"basic auth, token as user", "GitHub.com.",
			hdr{"Authorization": {"basic " + base64.StdEncoding.EncodeToString([]byte(gh+":x-oauth-basic"))}}, "",
			hdr{"Authorization": {"basic " + base64.StdEncoding.EncodeToString([]byte(otherValue+":x-oauth-basic"))}}, "",
			Applied{"GH_TOKEN:basic:authorization"}, ""},
		{"basic in another header is not decoded", "github.com",
			hdr{"X-Thing": {basic("u:" + gh)}}, "",
			hdr{"X-Thing": {basic("u:" + gh)}}, "", nil, ""},
		{"query parameter, escaped, others untouched", "maps.example.com",
			hdr{}, "z=1&key=" + maps + "&a=%2f&key=x", hdr{}, "z=1&key=" + mapsEsc + "&a=%2f&key=x",
			Applied{"MAPS_KEY:query:key"}, ""},
		// With no header configured every header counts, query or not.
		{"query parameter only where configured", "maps.example.com",
			hdr{"X-Key": {maps}}, "other=" + maps, hdr{"X-Key": {e["MAPS"]}}, "other=" + maps, Applied{"MAPS_KEY:header:x-key"}, ""},
		{"unbound host keeps every placeholder", "evil.example",
			hdr{"X-Api-Key": {api}, "Authorization": {"Bearer " + gh}}, "key=" + maps,
			hdr{"X-Api-Key": {api}, "Authorization": {"Bearer " + gh}}, "key=" + maps, nil, ""},
		{"other secrets' placeholders stay on a bound host", "api.example.com",
			hdr{"X-Api-Key": {api}, "Authorization": {"Bearer " + gh}}, "key=" + maps,
			hdr{"X-Api-Key": {canary}, "Authorization": {"Bearer " + gh}}, "key=" + maps,
			Applied{"API_KEY:header:x-api-key"}, ""},
		{"placeholder in the wrong header stays", "api.example.com",
			hdr{"Authorization": {"Bearer " + api}}, "",
			hdr{"Authorization": {"Bearer " + api}}, "", nil, ""},
		{"parent of a wildcard is not bound by it", "www.example.com",
			hdr{"X-Api-Key": {api}}, "", hdr{"X-Api-Key": {api}}, "", nil, ""},
		{"require: placeholder present, competitors stripped", "strict.example.com",
			hdr{"Authorization": {"Bearer " + strict, "Bearer attacker-token"}, "X-Api-Key": {"attacker"}, "Private-Token": {"attacker"},
				"Cookie": {"session=attacker; keep=" + loose}, "X-Second": {loose}, "User-Agent": {"git"}}, "",
			hdr{"Authorization": {"Bearer " + e["STRICT"]}, "Cookie": {"keep=" + loose}, "X-Second": {e["LOOSE"]}, "User-Agent": {"git"}}, "",
			Applied{"LOOSE:header:x-second", "STRICT:header:authorization"}, ""},
		{"require: foreign token refused", "strict.example.com",
			hdr{"Authorization": {"Bearer attacker-token"}}, "", nil, "",
			nil, "secret STRICT is required for strict.example.com but the request does not carry its placeholder in the authorization header"},
		{"require: no credential refused", "strict.example.com",
			hdr{}, "", nil, "", nil, "secret STRICT is required"},
		{"require: placeholder in another header is not enough", "strict.example.com",
			hdr{"X-Second": {strict}}, "", nil, "", nil, "secret STRICT is required"},
		{"require: basic counts", "strict.example.com",
			hdr{"Authorization": {basic("u:" + strict)}, "Proxy-Authorization": {"Basic Zm9vOmJhcg=="}}, "",
			hdr{"Authorization": {basic("u:" + e["STRICT"])}}, "",
			Applied{"STRICT:basic:authorization"}, ""},
		{"require in any header or query: query counts", "anyreq.example.com",
			hdr{"Authorization": {"Bearer attacker"}}, "token=" + anyreq,
			hdr{}, "token=" + e["ANYREQ"],
			Applied{"ANYREQ:query:token"}, ""},
		{"require in any header or query: neither refused", "anyreq.example.com",
			hdr{"Authorization": {"Bearer attacker"}}, "token=attacker", nil, "",
			nil, "not carry its placeholder in any header or the token query parameter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.h.Clone()
			u := &url.URL{Scheme: "https", Host: tt.host, Path: "/x", RawQuery: tt.query}
			applied, err := s.Request(tt.host, h, u)
			if tt.wantErr != "" {
				var re *RequiredError
				if !errors.Is(err, ErrRequired) || !errors.As(err, &re) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want ErrRequired containing %q", err, tt.wantErr)
				}
				if !reflect.DeepEqual(h, tt.h) || u.RawQuery != tt.query {
					t.Errorf("refused request was changed: %v %q", h, u.RawQuery)
				}
				for _, v := range e {
					if strings.Contains(err.Error(), v) {
						t.Errorf("error carries a value: %v", err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(applied, tt.applied) {
				t.Errorf("applied = %q, want %q", applied, tt.applied)
			}
			bound := s.Bound(tt.host)
			if got := h.Get("Accept-Encoding"); bound != (got == "identity") {
				t.Errorf("Accept-Encoding = %q on a host bound=%v", got, bound)
			}
			h.Del("Accept-Encoding")
			if !reflect.DeepEqual(h, tt.wantH) {
				t.Errorf("header\n got  %q\n want %q", h, tt.wantH)
			}
			if u.RawQuery != tt.wantQuery {
				t.Errorf("query = %q, want %q", u.RawQuery, tt.wantQuery)
			}
			if q, _ := url.ParseQuery(u.RawQuery); strings.Contains(tt.wantQuery, mapsEsc) && q.Get("key") != e["MAPS"] {
				t.Errorf("query key decodes to %q, want the value", q.Get("key"))
			}
		})
	}
}
