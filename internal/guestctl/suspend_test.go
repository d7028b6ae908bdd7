package guestctl

import (
	"strings"
	"testing"
)

// A busy workspace's refusal names the processes and what to do: end
// them, and the caller's way that keeps them when it has one (a pause in
// place), else stop.
func TestBusyError(t *testing.T) {
	e := &BusyError{Branch: "feat/x", Slug: "feat-x", Processes: "42 claude (working directory)\n43 bash (working directory)"}
	for _, w := range []string{`VM "feat/x" cannot be suspended`, "\n  42 claude (working directory)\n  43 bash (working directory)\n", "`agent-vm sessions feat-x` lists agent sessions", "`agent-vm stop feat-x` shuts it down instead"} {
		if !strings.Contains(e.Error(), w) {
			t.Errorf("without a way to keep them: %q lacks %q", e.Error(), w)
		}
	}
	e.Instead = "`agent-vm suspend feat-x` without --save pauses the VM in place, keeping them"
	for _, w := range []string{`VM "feat/x" cannot be saved to disk`, "which saving unmounts", "(hint: `agent-vm suspend feat-x` without --save pauses the VM in place, keeping them; or end them first (`agent-vm sessions feat-x`"} {
		if !strings.Contains(e.Error(), w) {
			t.Errorf("with a way to keep them: %q lacks %q", e.Error(), w)
		}
	}
}
