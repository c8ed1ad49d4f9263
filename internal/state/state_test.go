package state

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
)

func TestResolveMoatHome(t *testing.T) {
	t.Setenv("MOAT_HOME", "/x/home")
	d, err := Resolve()
	if err != nil {
		t.Fatal(err)
	}
	want := Dirs{Config: "/x/home/config", State: "/x/home/state", Cache: "/x/home/cache"}
	if d != want {
		t.Fatalf("got %+v, want %+v", d, want)
	}
}

func TestUpdateConcurrentWritersLoseNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sb")
	if err := Create(dir, &Record{Name: "sb"}); err != nil {
		t.Fatal(err)
	}
	const writers = 20
	var wg sync.WaitGroup
	for i := 0; i < writers; i++ {
		wg.Go(func() {
			if err := Update(dir, func(r *Record) error { r.GuestUID++; return nil }); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	r, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if r.GuestUID != writers || r.Schema != RecordSchema {
		t.Fatalf("got uid %d schema %d, want %d and %d", r.GuestUID, r.Schema, writers, RecordSchema)
	}
	if fi, _ := os.Stat(filepath.Join(dir, recordFile)); fi.Mode().Perm() != 0o600 {
		t.Fatalf("record mode %v", fi.Mode())
	}
}

func TestEffectiveCrashedWithoutDaemon(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		state, wantState, wantReason string
		daemon                       bool
	}{
		{StateRunning, StateCrashed, StopCrash, false},
		{StateStarting, StateCrashed, StopCrash, false},
		{StateRunning, StateRunning, "", true},
		{StateStopped, StateStopped, StopUser, false},
		// A suspend or resume whose daemon died is a crash too; a
		// suspended sandbox has no daemon by definition.
		{StateSuspending, StateCrashed, StopCrash, false},
		{StateResuming, StateCrashed, StopCrash, false},
		{StateSuspended, StateSuspended, "", false},
	}
	for _, tc := range tests {
		var release func()
		if tc.daemon {
			var ok bool
			var err error
			release, ok, err = TryLock(DaemonLock(dir))
			if err != nil || !ok {
				t.Fatal(err)
			}
		}
		r := &Record{State: tc.state}
		if tc.state == StateStopped {
			r.StopReason = StopUser
		}
		// The lock is per open file: a second open in this process sees it held.
		gotState, gotReason := Effective(r, dir)
		if gotState != tc.wantState || gotReason != tc.wantReason {
			t.Errorf("%s daemon=%v: got %s/%s, want %s/%s", tc.state, tc.daemon, gotState, gotReason, tc.wantState, tc.wantReason)
		}
		if release != nil {
			release()
		}
	}
}

func TestLoadRefusesNewerSchema(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, recordFile), []byte(`{"schema": 99}`), 0o600)
	if _, err := Load(dir); err == nil {
		t.Fatal("a record from a newer moat was accepted")
	}
}
