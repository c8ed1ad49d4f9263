package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"time"

	"moat.dev/moat/internal/state"
)

// record reads the sandbox's record. The gate process, which cannot read
// the state directory, reads its own copy: taken before its jail, and
// changed only by its own edits (updateRecord), which the keeper writes.
func (d *daemon) record() (*state.Record, error) {
	if d.keeper == nil {
		return state.Load(d.o.Dir)
	}
	d.recMu.Lock()
	defer d.recMu.Unlock()
	return cloneRecord(d.rec)
}

// updateRecord changes the sandbox's record under its lock; in the gate
// process, by sending the keeper the edit fn made (recordEdit), which it
// checks before writing.
func (d *daemon) updateRecord(fn func(*state.Record) error) error {
	if d.keeper == nil {
		return state.Update(d.o.Dir, fn)
	}
	d.recMu.Lock()
	defer d.recMu.Unlock()
	next, err := cloneRecord(d.rec)
	if err != nil {
		return err
	}
	if err := fn(next); err != nil {
		return err
	}
	e, changed, err := editOf(d.rec, next)
	if err != nil || !changed {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := d.keeper.call(ctx, "record", e, nil); err != nil {
		return err
	}
	d.rec = next
	return nil
}

func cloneRecord(r *state.Record) (*state.Record, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	var out state.Record
	return &out, json.Unmarshal(b, &out)
}

// editOf is the edit that turns old into next, or an error if next
// differs in a field the gate process may not change.
func editOf(old, next *state.Record) (recordEdit, bool, error) {
	var e recordEdit
	changed := false
	if next.State != old.State {
		e.State, changed = next.State, true
	}
	if next.Hook != old.Hook {
		h := next.Hook
		e.Hook, changed = &h, true
	}
	if next.SetUp != old.SetUp {
		if !next.SetUp {
			return e, false, errors.New("record: set_up cannot be cleared")
		}
		e.SetUp, changed = true, true
	}
	if !maps.Equal(next.Placeholders, old.Placeholders) {
		e.Placeholders, changed = next.Placeholders, true
	}
	if !slices.Equal(next.Presets, old.Presets) {
		e.Presets, changed = next.Presets, true
	}
	if !reflect.DeepEqual(next.Rules, old.Rules) {
		e.Rules, e.RulesSet, changed = next.Rules, true, true
	}
	if !reflect.DeepEqual(next.Forwards, old.Forwards) {
		e.Forwards, e.ForwardsSet, changed = next.Forwards, true, true
	}
	// Everything else must be as it was.
	a, b := *old, *next
	for _, r := range []*state.Record{&a, &b} {
		r.State, r.Hook, r.SetUp, r.Placeholders, r.Presets, r.Rules, r.Forwards = "", "", false, nil, nil, nil, nil
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if string(ja) != string(jb) {
		return e, false, errors.New("record: the gate process changed a field only the keeper writes")
	}
	return e, changed, nil
}
