package qemu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/driver"
)

// vagrantBoot stands for another driver's plan.
type vagrantBoot struct{}

func (vagrantBoot) DriverName() string { return "vagrant" }

// The driver runs only its own plans, and says whose plan it was handed;
// nothing is started (the launcher has no runner to start anything with).
func TestDriverRefusesAnotherDriversPlan(t *testing.T) {
	d := NewDriver(&Launcher{})
	m := driver.Machine{Name: "agent-vm-x", UUID: "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", CPUs: 1, MemoryMiB: 256, RunDir: t.TempDir(), LogsDir: t.TempDir()}
	_, err := d.Start(context.Background(), m, vagrantBoot{}, driver.StartOptions{Accel: "tcg"})
	if err == nil || !strings.Contains(err.Error(), `"vagrant"`) || !strings.Contains(err.Error(), "qemu driver") {
		t.Errorf("got %v, want a refusal naming both drivers", err)
	}
}

func TestDriverResumeRefusesAnotherDriversPlan(t *testing.T) {
	d := NewDriver(&Launcher{})
	m := driver.Machine{Name: "agent-vm-x", UUID: "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", CPUs: 1, MemoryMiB: 256, RunDir: t.TempDir(), LogsDir: t.TempDir()}
	_, err := d.Resume(context.Background(), m, vagrantBoot{}, driver.StartOptions{Accel: "tcg"})
	if err == nil || !strings.Contains(err.Error(), `"vagrant"`) || !strings.Contains(err.Error(), "qemu driver") {
		t.Errorf("got %v, want a refusal naming both drivers", err)
	}
}

// Destroy removes the socket directory SocketDirFor put outside a long run
// directory, and never a run directory.
func TestDriverDestroyRemovesOnlyAnOutsideSocketDir(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
	d := NewDriver(&Launcher{})
	long := filepath.Join(t.TempDir(), strings.Repeat("long-state-path", 6), "run")
	m := driver.Machine{UUID: "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", RunDir: long}
	sock := SocketDirFor(long, m.UUID)
	short := driver.Machine{UUID: m.UUID, RunDir: t.TempDir()}
	for _, dir := range []string{sock, long, short.RunDir} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Destroy(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	if err := d.Destroy(context.Background(), short); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket directory %s is still there: %v", sock, err)
	}
	for _, dir := range []string{long, short.RunDir} {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("destroy removed the run directory %s: %v", dir, err)
		}
	}
}
