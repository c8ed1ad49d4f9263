package daemon

import "moat.dev/moat/internal/state"

// record reads the sandbox's record.
func (d *daemon) record() (*state.Record, error) { return state.Load(d.o.Dir) }

// updateRecord changes the sandbox's record under its lock.
func (d *daemon) updateRecord(fn func(*state.Record) error) error { return state.Update(d.o.Dir, fn) }
