// Package escape is a set of attempts to get out of the lockdown jail, made
// from inside it. The lockdown package's tests run them in a jailed child;
// a test-only hook in the real gate process runs the same ones there, so
// the jail is proven where it is used, not just in a test harness. Nothing
// else may import it.
//
// An attempt is an action that would succeed in an unjailed process of the
// same uid (or in any process, for the ones only seccomp stops): failing
// for another reason proves nothing, so each is built to be valid. A
// Result with a nil Err is an attempt that succeeded, which is a hole in the
// jail. Attempts undo what a success did where they can (a created file is
// removed, a traced process detached, a new process reaped), but an
// attempted exec that succeeds replaces the calling process: the caller
// sees its child vanish instead of a report.
package escape
