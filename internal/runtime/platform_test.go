package runtime

import (
	"errors"
	"strings"
	"testing"
)

func TestChoosePlatform(t *testing.T) {
	yes, no := KVM{Usable: true}, KVM{Why: "/dev/kvm does not exist"}
	tests := []struct {
		want    string
		kvm     KVM
		got     string
		errPart string
	}{
		{"", yes, "kvm", ""},
		{"auto", yes, "kvm", ""},
		{"", no, "systrap", ""},
		{"auto", no, "systrap", ""},
		{"systrap", yes, "systrap", ""},
		{"systrap", no, "systrap", ""},
		{"kvm", yes, "kvm", ""},
		{"kvm", no, "", "/dev/kvm does not exist; set [sandbox] platform = \"auto\""},
		{"ptrace", yes, "", "unknown platform"},
	}
	for _, tt := range tests {
		got, err := ChoosePlatform(tt.want, tt.kvm)
		if got != tt.got {
			t.Errorf("ChoosePlatform(%q, %+v) = %q, want %q", tt.want, tt.kvm, got, tt.got)
		}
		if (err != nil) != (tt.errPart != "") || (err != nil && !strings.Contains(err.Error(), tt.errPart)) {
			t.Errorf("ChoosePlatform(%q, %+v) error = %v, want one containing %q", tt.want, tt.kvm, err, tt.errPart)
		}
		if tt.want == "kvm" && !tt.kvm.Usable && !errors.Is(err, ErrNoKVM) {
			t.Errorf("kvm without KVM: error %v is not ErrNoKVM", err)
		}
	}
}

func TestRunscArgsPlatform(t *testing.T) {
	p := &Plan{StateDir: "/s", Platform: "kvm"}
	args := strings.Join(p.runscArgs(false), " ")
	if !strings.Contains(args, "--platform=kvm") || strings.Contains(args, "--platform=systrap") {
		t.Errorf("runsc args with Platform kvm: %s", args)
	}
	p.Platform = ""
	if args := strings.Join(p.runscArgs(false), " "); !strings.Contains(args, "--platform=systrap") {
		t.Errorf("runsc args without a platform: %s", args)
	}
}
