package guestctl

import (
	"strings"
	"testing"
)

// The guest's answer to provisionCheck, and the error a failure on this
// boot becomes.
func TestProvisionStatus(t *testing.T) {
	out := "status=failed\nexit=3\nboot=b1\ncurrent=b1\n---\nagent-vm-provision: running /workspace/.agent-vm/provision.sh\noops \x1b[31mred\x1b[0m\n"
	st := parseProvisionStatus(out)
	if st.status != "failed" || st.exit != 3 || st.boot != "b1" || st.current != "b1" || !strings.HasSuffix(st.tail, "red\x1b[0m") {
		t.Fatalf("parsed %+v", st)
	}
	msg := (&ProvisionError{VM: "feat/x", Slug: "feat-x", Exit: st.exit, Tail: st.tail}).Error()
	for _, want := range []string{"feat/x: the repository's provisioning failed", "exit status 3", "/var/log/agent-vm-provision.log",
		"  oops ", "`agent-vm logs feat-x`", "`agent-vm reset --force feat-x`"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "\x1b") {
		t.Errorf("the guest's escape codes reach the terminal:\n%q", msg)
	}
	if st := parseProvisionStatus("current=b2\n"); st.status != "" {
		t.Errorf("no status file: %+v", st)
	}
}
