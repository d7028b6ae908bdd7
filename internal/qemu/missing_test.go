package qemu

import (
	"context"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
)

// A FAKE runner (execxtest) stands in for a host without QEMU: it
// answers LookPath with "not found" and fails on anything else.

func TestMissingQEMUNamesThePackage(t *testing.T) {
	fake := execxtest.New(t).Installed("qemu-system-x86_64", "")
	a, _ := ArchFor("amd64")
	l := &Launcher{Run: fake, Log: hclog.NewNullLogger(), Arch: a, PortFree: func(int) bool { return true }}
	m := Machine{Machine: driver.Machine{Name: "x", UUID: "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", CPUs: 1, MemoryMiB: 256, RunDir: t.TempDir(), LogsDir: t.TempDir()}}
	_, err := l.Start(context.Background(), m, Boot{Direct: &Direct{}}, StartOptions{Accel: "tcg"})
	if err == nil || !strings.Contains(err.Error(), "apt-get install qemu-system-x86") {
		t.Errorf("got %v, want a hint naming the Debian package", err)
	}
	if calls := fake.Calls(); len(calls) != 0 {
		t.Errorf("ran %v although QEMU is missing", calls)
	}
}
