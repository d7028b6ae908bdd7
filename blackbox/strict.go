package blackbox

import (
	"fmt"
	"os"
)

// StrictEnv names the environment variable that turns skips into failures:
// with StrictEnv=1 (as CI sets), a test or scenario that needs something
// this host lacks fails instead of skipping, so nothing is skipped silently.
// This is the one place that spells the rule; internal/testutil uses it too.
const StrictEnv = "AGENT_VM_TEST_STRICT"

// Strict reports whether getenv (os.Getenv, or a run's injected lookup)
// sets StrictEnv to 1.
func Strict(getenv func(string) string) bool { return getenv(StrictEnv) == "1" }

// TB is the part of testing.TB that Need and SkipOrFail use (declared here so
// that programs built from this package do not link the testing package).
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
}

// Need skips the test with reason when ok is false, or fails it when
// StrictEnv=1 is set in the environment.
func Need(t TB, ok bool, reason string) {
	t.Helper()
	if ok {
		return
	}
	if Strict(os.Getenv) {
		t.Fatalf("prerequisite missing (%s=1): %s", StrictEnv, reason)
	}
	t.Skipf("skipping: %s (set %s=1 to make this a failure)", reason, StrictEnv)
}

// SkipOrFail is Need for a prerequisite already found missing, with the
// reason given as a format and its arguments.
func SkipOrFail(t TB, format string, args ...any) {
	t.Helper()
	Need(t, false, fmt.Sprintf(format, args...))
}
