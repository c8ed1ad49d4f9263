package audit

import (
	"errors"
	"testing"
	"time"
)

func TestReasonIs(t *testing.T) {
	for _, tt := range []struct {
		r     Reason
		fixed Reason
		want  bool
	}{
		{ReasonNoRule, ReasonNoRule, true},
		{ReasonBlocked, ReasonNoRule, false},
		{RefusedClass("private"), ReasonRefusedClass, true},
		{RefusedClass("private"), ReasonNoRule, false},
		{HeldTimedOut(30 * time.Second), ReasonHeld, true},
		{HeldOverflow(16), ReasonHeld, true},
		{ReasonWatcherLeft, ReasonHeld, true},
		{ReasonWatcherDenied, ReasonHeld, false},
		{BadHead(errors.New("x")), ReasonBadHead, true},
		{Fronting("a.test", "b.test"), ReasonFronting, true},
		{Unrecorded(errors.New("disk full")), ReasonUnrecorded, true},
		{NamelessToPool(ReasonNoSNI), ReasonNoSNI, true},
		{"", ReasonNoRule, false},
	} {
		if got := tt.r.Is(tt.fixed); got != tt.want {
			t.Errorf("%q.Is(%q) = %v, want %v", tt.r, tt.fixed, got, tt.want)
		}
	}
}
