package vm

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guestctl"
	"github.com/agent-vm/agent-vm/internal/qemu"
	"github.com/agent-vm/agent-vm/internal/vagrant"
)

// Which ways of suspending each driver allows: QEMU's saves, pauses and
// hibernates; vagrant's suspend is a pause, so --save is refused with the
// way that works, as --hibernate is; a driver with neither is refused
// whatever the options.
func TestCheckSuspendWay(t *testing.T) {
	q, v := &qemu.Driver{}, &vagrant.Driver{}
	for _, tc := range []struct {
		name string
		sus  driver.Suspender
		p    driver.Pauser
		hib  driver.Hibernator
		o    SuspendOptions
		want string // in the refusal; "" for none
	}{
		{"qemu", q, q, q, SuspendOptions{}, ""},
		{"qemu --save", q, q, q, SuspendOptions{Save: true}, ""},
		{"qemu --pause", q, q, q, SuspendOptions{Pause: true}, ""},
		{"qemu --hibernate", q, q, q, SuspendOptions{Hibernate: true}, ""},
		{"vagrant", v, nil, nil, SuspendOptions{}, ""},
		{"vagrant --pause", v, nil, nil, SuspendOptions{Pause: true}, ""},
		{"vagrant --save", v, nil, nil, SuspendOptions{Save: true}, "cannot be saved to disk: the x driver that runs it only pauses machines in place (hint: `agent-vm suspend feat` without --save pauses it)"},
		{"vagrant --hibernate", v, nil, nil, SuspendOptions{Hibernate: true}, "cannot hibernate: the x driver that runs it cannot move its memory to disk (hint: `agent-vm suspend feat` without --hibernate)"},
		{"neither", nil, nil, nil, SuspendOptions{}, "does not suspend machines (hint: `agent-vm stop feat`"},
		{"neither --pause", nil, nil, nil, SuspendOptions{Pause: true}, "does not suspend machines"},
		{"a pauser only, --save", nil, q, nil, SuspendOptions{Save: true}, "only pauses machines in place"},
		{"a pauser only, --hibernate", nil, q, nil, SuspendOptions{Hibernate: true}, "cannot hibernate"},
		{"a saver only, --pause", saverOnly{q}, nil, nil, SuspendOptions{Pause: true}, "cannot be paused in place: the x driver that runs it does not pause machines (hint: `agent-vm suspend feat` without --pause)"},
	} {
		err := checkSuspendWay("feat", "feat", "x", tc.sus, tc.p, tc.hib, tc.o)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, driver.ErrUnsupported)):
			t.Errorf("%s: got %v, want ErrUnsupported saying %q", tc.name, err, tc.want)
		}
	}
}

// saverOnly is QEMU's Suspender without its Pauser: a driver that saves
// and cannot pause.
type saverOnly struct{ driver.Suspender }

// A save that failed because the workspace is busy, or before anything
// changed because the machine cannot be saved, is paused instead, saying
// why; any other failure is the suspend's.
func TestPauseInstead(t *testing.T) {
	busy := &guestctl.BusyError{Branch: "feat", Slug: "feat", Processes: "42 claude (working directory)"}
	unsupported := fmt.Errorf("agent-vm-feat cannot be suspended: no slot: %w", driver.ErrUnsupported)
	for _, tc := range []struct {
		name             string
		err              error
		pause            bool
		busy, cannotSave string
	}{
		{"busy", busy, true, busy.Processes, ""},
		{"busy, wrapped", fmt.Errorf("suspending: %w", busy), true, busy.Processes, ""},
		{"cannot be saved", unsupported, true, "", unsupported.Error()},
		{"failed", errors.New("saving the state: disk full"), false, "", ""},
		{"saved", nil, false, "", ""},
	} {
		var res SuspendResult
		if got := pauseInstead(tc.err, &res); got != tc.pause || res.Busy != tc.busy || res.CannotSave != tc.cannotSave {
			t.Errorf("%s: pause %v, busy %q, cannot save %q; want %v, %q, %q", tc.name, got, res.Busy, res.CannotSave, tc.pause, tc.busy, tc.cannotSave)
		}
	}
}
