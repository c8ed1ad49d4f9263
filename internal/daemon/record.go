package daemon

import "moat.dev/moat/internal/state"

// record reads the sandbox's record.
func (d *daemon) record() (*state.Record, error) { return d.record() }

// updateRecord changes the sandbox's record under its lock.
func (d *daemon) updateRecord(fn func(*state.Record) error) error { return d.updateRecord(fn) }
