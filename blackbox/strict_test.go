package blackbox

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// recorder is a TB that records how a test ended. Like testing's, its
// Fatalf and Skipf end the goroutine; run calls f in one of its own.
type recorder struct{ fatal, skip string }

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(f string, args ...any) {
	r.fatal = fmt.Sprintf(f, args...)
	runtime.Goexit()
}
func (r *recorder) Skipf(f string, args ...any) {
	r.skip = fmt.Sprintf(f, args...)
	runtime.Goexit()
}

func (r *recorder) run(f func(TB)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
}

func TestNeedSkipsOrFails(t *testing.T) {
	for _, c := range []struct {
		env        string
		ok         bool
		fail, skip bool
	}{
		{"", true, false, false},
		{"1", true, false, false},
		{"", false, false, true},
		{"0", false, false, true},
		{"1", false, true, false},
	} {
		t.Setenv(StrictEnv, c.env)
		var r recorder
		r.run(func(t TB) { Need(t, c.ok, "no frobnicator") })
		if (r.fatal != "") != c.fail || (r.skip != "") != c.skip {
			t.Errorf("%s=%q, ok %v: fatal %q, skip %q; want fail %v, skip %v", StrictEnv, c.env, c.ok, r.fatal, r.skip, c.fail, c.skip)
		}
		for _, msg := range []string{r.fatal, r.skip} {
			if msg != "" && !strings.Contains(msg, "no frobnicator") {
				t.Errorf("message %q does not give the reason", msg)
			}
		}
	}
	t.Setenv(StrictEnv, "1")
	var r recorder
	r.run(func(t TB) { SkipOrFail(t, "%s is missing", "qemu-img") })
	if r.fatal != "prerequisite missing (AGENT_VM_TEST_STRICT=1): qemu-img is missing" {
		t.Errorf("SkipOrFail under strict: fatal %q, skip %q", r.fatal, r.skip)
	}
}

func TestStrictReadsTheGivenLookup(t *testing.T) {
	env := map[string]string{StrictEnv: "1"}
	if !Strict(func(k string) string { return env[k] }) {
		t.Error("Strict ignores its lookup")
	}
	if Strict(func(string) string { return "" }) {
		t.Error("Strict without the variable")
	}
}
