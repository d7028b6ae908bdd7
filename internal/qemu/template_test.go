package qemu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/driver"
)

// cloneOf is sampleMachine as another VM: its own name, uuid, directories,
// ports and token file.
func cloneOf(m Machine) Machine {
	c := m
	c.Name, c.UUID = "agent-vm-feature-y", "11111111-2222-4333-8444-555555555555"
	c.RunDir, c.LogsDir = "/state/feature-y/run", "/state/feature-y/logs"
	c.Share.Source = "/state/feature-y/workspace"
	c.Forwards = []driver.Forward{{Name: "ssh", Host: 2223, Guest: 22}, {Name: "mcp", Host: 8001, Guest: 8000}}
	c.Credentials = []driver.Credential{{Name: "agent-vm.mcp-token", File: "/state/feature-y/secrets/mcp-token"}}
	return c
}

func directFor(dir string) *Direct {
	return &Direct{Disks: []Disk{{Path: dir + "/disk.qcow2", Format: "qcow2"}, {Path: dir + "/seed.iso", Format: "raw", ReadOnly: true}},
		Kernel: "/images/v1/vmlinuz", Append: "console=ttyS0", MAC: "52:54:00:12:34:56"}
}

// TestCheckTemplate: a clone may differ from its template in its files,
// uuid and host plumbing, not in its machine or QEMU; a changed template
// disk is refused.
func TestCheckTemplate(t *testing.T) {
	a, _ := ArchFor("amd64")
	tm := sampleMachine()
	disk := filepath.Join(t.TempDir(), "disk.qcow2")
	if err := os.WriteFile(disk, []byte("template"), 0o400); err != nil {
		t.Fatal(err)
	}
	ids, err := diskIDs([]string{disk})
	if err != nil {
		t.Fatal(err)
	}
	saved := &savedState{QEMU: "7.2.22", MachineArgs: machineKey(ResumeArgv(a, tm, directFor("/state/feature-x"), "tcg", driver.ShareVirtiofs, sampleHardening())), Disks: ids}
	clone := machineKey(ResumeArgv(a, cloneOf(tm), directFor("/state/feature-y"), "tcg", driver.ShareVirtiofs, sampleHardening()))
	if err := checkTemplate(saved, "7.2.22", clone); err != nil {
		t.Errorf("a clone with its own files and ports: %v", err)
	}
	bigger := cloneOf(tm)
	bigger.MemoryMiB = 2048
	for name, tc := range map[string]struct {
		version string
		key     []string
		want    string
	}{
		"qemu":   {"8.2.0", clone, "saved by QEMU 7.2.22 and this host's QEMU is 8.2.0"},
		"memory": {"7.2.22", machineKey(ResumeArgv(a, bigger, directFor("/state/feature-y"), "tcg", driver.ShareVirtiofs, sampleHardening())), `saved "1024M", now "2048M"`},
		"accel":  {"7.2.22", machineKey(ResumeArgv(a, cloneOf(tm), directFor("/state/feature-y"), "kvm", driver.ShareVirtiofs, sampleHardening())), "differs from the template's"},
	} {
		err := checkTemplate(saved, tc.version, tc.key)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", name, err, tc.want)
		}
	}
	if err := os.WriteFile(disk, []byte("changed!"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := checkTemplate(saved, "7.2.22", clone); err == nil || !strings.Contains(err.Error(), "changed since it was saved") {
		t.Errorf("a changed template disk: got %v", err)
	}
}
