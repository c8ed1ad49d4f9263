package forward

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/state"
)

func TestParse(t *testing.T) {
	tests := []struct {
		spec     string
		want     state.Forward
		wantPair bool
		wantErr  bool
	}{
		{spec: "3000", want: state.Forward{Host: 3000, Guest: 3000}},
		{spec: "8080:80", want: state.Forward{Host: 8080, Guest: 80}, wantPair: true},
		{spec: " 1:65535 ", want: state.Forward{Host: 1, Guest: 65535}, wantPair: true},
		{spec: "", wantErr: true},
		{spec: "0", wantErr: true},
		{spec: "65536", wantErr: true},
		{spec: "3000-3010", wantErr: true}, // ranges would open the loopback wholesale
		{spec: "*", wantErr: true},
		{spec: "*:80", wantErr: true},
		{spec: "+80", wantErr: true},
		{spec: "-1", wantErr: true},
		{spec: "0x50", wantErr: true},
		{spec: "8080:", wantErr: true},
		{spec: ":80", wantErr: true},
		{spec: "1:2:3", wantErr: true},
		{spec: "127.0.0.1:80", wantErr: true},
		{spec: "/run/moat/control.sock", wantErr: true},
	}
	for _, tt := range tests {
		got, pair, err := Parse(tt.spec)
		if tt.wantErr {
			if !errors.Is(err, ErrSpec) {
				t.Errorf("Parse(%q) = %v, %v; want an ErrSpec", tt.spec, got, err)
			}
			continue
		}
		if err != nil || got != tt.want || pair != tt.wantPair {
			t.Errorf("Parse(%q) = %v, %v, %v; want %v, %v", tt.spec, got, pair, err, tt.want, tt.wantPair)
		}
	}
}

func TestCheckAddress(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{in: "", want: ""},
		{in: "127.0.0.1", want: ""},
		{in: "0.0.0.0", want: "0.0.0.0"},
		{in: "::1", want: "::1"},
		{in: "192.168.1.5", want: "192.168.1.5"},
		{in: "localhost", wantErr: true},
		{in: "10.0.0.0/8", wantErr: true},
		{in: "fe80::1%eth0", wantErr: true},
	}
	for _, tt := range tests {
		got, err := CheckAddress(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("CheckAddress(%q) = %q, %v; want %q, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

var cfg = config.Forwards{
	Ports:   []config.Forward{{Host: 3000, Guest: 3000}, {Host: 8080, Guest: 80}},
	Reverse: []config.Forward{{Host: 5432, Guest: 5432}},
}

func TestEntries(t *testing.T) {
	rt := &state.RuntimeForwards{
		Ports:   []state.Forward{{Host: 9000, Guest: 9000, Address: "0.0.0.0"}, {Host: 8080, Guest: 81}},
		Reverse: []state.Forward{{Host: 15432, Guest: 6543}, {Host: 1, Guest: 5432}},
	}
	got := Entries(cfg, rt)
	want := []Entry{
		{Forward: state.Forward{Host: 3000, Guest: 3000}, Source: SourceConfig},
		{Forward: state.Forward{Host: 8080, Guest: 80}, Source: SourceConfig},
		{Reverse: true, Forward: state.Forward{Host: 5432, Guest: 5432}, Source: SourceConfig},
		{Forward: state.Forward{Host: 9000, Guest: 9000, Address: "0.0.0.0"}, Source: SourceRuntime},
		{Reverse: true, Forward: state.Forward{Host: 15432, Guest: 6543}, Source: SourceRuntime},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Entries:\ngot  %+v\nwant %+v", got, want)
	}
}

func TestAddRemove(t *testing.T) {
	type step struct {
		op      string // add | remove
		reverse bool
		spec    string
		addr    string
		wantErr bool
	}
	steps := []step{
		{op: "add", spec: "4000"},
		{op: "add", spec: "4000"},                   // the same again: nothing to do
		{op: "add", spec: "4000:41", wantErr: true}, // host port 4000 is taken
		{op: "add", spec: "3000:30", wantErr: true}, // taken by the configuration
		{op: "add", spec: "4000", addr: "0.0.0.0", wantErr: true},
		{op: "add", reverse: true, spec: "15432:5432", wantErr: true}, // gateway 5432 is the configuration's
		{op: "add", reverse: true, spec: "15432:6000"},
		{op: "add", reverse: true, spec: "6000", addr: "0.0.0.0", wantErr: true},
		{op: "add", spec: "6000"},                   // the same number in the other direction is another port
		{op: "remove", spec: "3000", wantErr: true}, // configuration's
		{op: "remove", reverse: true, spec: "5432", wantErr: true},
		{op: "remove", spec: "4000:99", wantErr: true}, // both named: must both match
		{op: "remove", spec: "4000"},
		{op: "remove", spec: "4000", wantErr: true}, // gone already
		{op: "remove", reverse: true, spec: "15432:6000"},
	}
	rt := &state.RuntimeForwards{}
	for i, s := range steps {
		f, pair, err := Parse(s.spec)
		if err != nil {
			t.Fatal(err)
		}
		f.Address = s.addr
		if s.op == "add" {
			err = Add(rt, cfg, "api", s.reverse, f)
		} else {
			_, err = Remove(rt, cfg, "api", s.reverse, f, pair)
		}
		if (err != nil) != s.wantErr {
			t.Fatalf("step %d %+v: err %v, want error %v", i, s, err, s.wantErr)
		}
		if err != nil && !errors.Is(err, ErrSpec) {
			t.Errorf("step %d: %v is not an ErrSpec", i, err)
		}
	}
	want := &state.RuntimeForwards{Ports: []state.Forward{{Host: 6000, Guest: 6000}}, Reverse: []state.Forward{}}
	if len(rt.Reverse) != 0 || !reflect.DeepEqual(rt.Ports, want.Ports) {
		t.Errorf("after the steps: got %+v, want %+v", rt, want)
	}
}

func TestReverseTable(t *testing.T) {
	tab := ReverseTable(Entries(cfg, &state.RuntimeForwards{Reverse: []state.Forward{{Host: 15432, Guest: 6543}}}))
	tests := []struct {
		port   uint16
		want   uint16
		wantOK bool
	}{
		{port: 5432, want: 5432, wantOK: true},
		{port: 6543, want: 15432, wantOK: true},
		{port: 15432}, // the host side of a forward is not a gateway port
		{port: 3000},  // host → guest forwards open nothing at the gateway
		{port: 53},
		{port: 22},
		{port: 0},
	}
	for _, tt := range tests {
		got, ok := tab.Lookup(tt.port)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("Lookup(%d) = %d, %v; want %d, %v", tt.port, got, ok, tt.want, tt.wantOK)
		}
	}
	if _, ok := Table(nil).Lookup(5432); ok {
		t.Error("an empty table opened a port")
	}
}

func TestCheckMCP(t *testing.T) {
	servers := map[string]config.MCPServer{
		"ed":     {Name: "ed", Local: true, Host: "127.0.0.1", Port: 7777, Source: "/p/moat.toml"},
		"remote": {Name: "remote", Host: "mcp.example.com", Port: 5432},
	}
	for _, tc := range []struct {
		f    state.Forward
		want string
	}{
		{state.Forward{Host: 5432, Guest: 5432}, ""},
		{state.Forward{Host: 8000, Guest: 7777}, "gateway port 7777 is MCP server ed's"},
		{state.Forward{Host: 7777, Guest: 17777}, "would bypass them"},
	} {
		err := CheckMCP(servers, tc.f)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.f, err)
		case tc.want != "" && (err == nil || !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: err = %v, want %q", tc.f, err, tc.want)
		}
	}
}
