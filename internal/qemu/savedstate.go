package qemu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
)

// The saved state's files in the run directory (see suspend.go). The state
// holds the guest's memory, secrets included: 0600, in the VM's 0700 run
// directory, and gone with the VM's directory on destroy.
const (
	StateFile = "suspend.state"
	StateMeta = "suspend.json"
	// RAMFile holds the guest's RAM of a state saved with it apart
	// (savedState.RAMApart): the memfd's data at its offsets, holes and
	// blocks of zeros left as holes (internal/guestram).
	RAMFile = "suspend.ram"
)

// savedState is what a suspend records beside the state file, to refuse a
// resume the state does not fit.
type savedState struct {
	Version int `json:"version"`
	// QEMU is the version of the QEMU that saved it ("7.2.22"): a state
	// loads only into the QEMU that wrote it (machine types and device
	// state formats change between versions).
	QEMU string `json:"qemu"`
	// Machine is the hash of MachineArgs, the machine's command line
	// without its host-side plumbing (machineKey).
	Machine     string   `json:"machine"`
	MachineArgs []string `json:"machine_args"`
	// Disks are the writable disks as QEMU left them: a disk changed
	// since (booted cold, replaced) no longer matches the memory's view.
	Disks   []diskID         `json:"disks"`
	Share   driver.ShareMode `json:"share"`
	Accel   string           `json:"accel"`
	SavedAt time.Time        `json:"saved_at"`
	// Bytes are the stream's and RAMFile's together.
	Bytes int64 `json:"bytes"`
	// RAMApart: the guest's RAM is in RAMFile and the stream was saved
	// with x-ignore-shared (version 2; a version 1 state has it in the
	// stream).
	RAMApart bool `json:"ram_apart,omitempty"`
}

// savedStateVersion is the record's version; this agent-vm reads
// versions from 1 (an agent-vm before 2 would load a version 2 stream
// without its RAM, so it must refuse it).
const savedStateVersion = 2

// diskID identifies a disk file's content without reading it.
type diskID struct {
	Path    string `json:"path"`
	Size    int64  `json:"size"`
	ModTime int64  `json:"mtime_ns"`
	Inode   uint64 `json:"inode"`
}

func readSavedState(m Machine) (*savedState, error) {
	b, err := os.ReadFile(m.runFile(StateMeta))
	if err != nil {
		return nil, err
	}
	var s savedState
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", m.runFile(StateMeta), err)
	}
	if s.Version < 1 || s.Version > savedStateVersion {
		return nil, fmt.Errorf("%s: version %d, this agent-vm reads 1 to %d", m.runFile(StateMeta), s.Version, savedStateVersion)
	}
	return &s, nil
}

// hasSavedState reports whether m has a complete saved state: its record
// (written last by a suspend) exists.
func hasSavedState(m Machine) bool { return exists(m.runFile(StateMeta)) }

// discardSavedState removes the saved state and its record.
func discardSavedState(m Machine) error {
	var errs []error
	for _, f := range []string{m.runFile(StateMeta), m.runFile(StateFile), m.runFile(StateFile + ".tmp"), m.runFile(RAMFile), m.runFile(RAMFile + ".part")} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// plumbing are the options that connect QEMU to the host rather than make the
// guest's machine: sockets, files, logs, the sandbox and user, the network's host
// side (forwards and guestfwd rules are slirp's, and the guest's NIC is a
// -device). They may differ between a suspend and its resume.
var plumbing = map[string]bool{"-name": true, "-sandbox": true, "-runas": true, "-netdev": true, "-serial": true,
	"-monitor": true, "-qmp": true, "-pidfile": true, "-incoming": true, "-chardev": true}

// machineKey is argv without its plumbing and without the virtiofs
// device (which a suspend unplugs and a resume plugs back): what must be
// the same for a saved state to load.
func machineKey(argv []string) []string {
	var out []string
	for i := 0; i < len(argv); i++ {
		a := argv[i]
		switch {
		case a == "-S":
			continue
		case plumbing[a]:
			i++
			continue
		case a == "-device" && i+1 < len(argv) && strings.HasPrefix(argv[i+1], "vhost-user-fs-pci,"):
			i++
			continue
		}
		out = append(out, a)
	}
	return out
}

func hashArgs(args []string) string {
	h := sha256.Sum256([]byte(strings.Join(args, "\x00")))
	return hex.EncodeToString(h[:])
}

// argvDiff names the first difference between two machine keys, for the
// refusal's message.
func argvDiff(saved, now []string) string {
	for i := 0; i < len(saved) || i < len(now); i++ {
		var s, n string
		if i < len(saved) {
			s = saved[i]
		}
		if i < len(now) {
			n = now[i]
		}
		if s != n {
			return fmt.Sprintf("saved %q, now %q", orNone(s), orNone(n))
		}
	}
	return "no difference"
}

func orNone(s string) string {
	if s == "" {
		return "(nothing)"
	}
	return s
}

// writableDisks are the files of argv's -drive options that QEMU writes.
func writableDisks(argv []string) []string {
	var out []string
	for _, v := range argValues(argv, "-drive") {
		if strings.Contains(v, "readonly=on") {
			continue
		}
		if f, ok := strings.CutPrefix(v, "file="); ok {
			out = append(out, unesc(f))
		}
	}
	return out
}

func diskIDs(paths []string) ([]diskID, error) {
	var out []diskID
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		id := diskID{Path: p, Size: fi.Size(), ModTime: fi.ModTime().UnixNano()}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			id.Inode = st.Ino
		}
		out = append(out, id)
	}
	return out, nil
}

var qemuVersionRE = regexp.MustCompile(`QEMU emulator version (\d+\.\d+\.\d+)`)

// qemuVersion asks the QEMU binary its version ("7.2.22"), as its QMP
// greeting says it.
func qemuVersion(ctx context.Context, run execx.Runner, bin string) (string, error) {
	res, err := run.Run(ctx, execx.Cmd{Path: bin, Args: []string{"--version"}})
	if err != nil {
		return "", fmt.Errorf("asking %s its version: %w", bin, err)
	}
	m := qemuVersionRE.FindStringSubmatch(string(res.Stdout))
	if m == nil {
		return "", fmt.Errorf("%s --version said %q, which names no version", bin, strings.TrimSpace(string(res.Stdout)))
	}
	return m[1], nil
}

// staleError refuses a saved state that does not fit, naming why and the
// way out (a cold boot, which discards it).
func staleError(m Machine, why string) error {
	return fmt.Errorf("%s cannot resume: %s (hint: the saved state is kept; `agent-vm start --cold BRANCH` discards it and boots the VM afresh, losing the processes it held): %w",
		m.Name, why, driver.ErrStaleState)
}

// checkSavedState compares a saved state with the machine a resume would
// start now: the same QEMU version, machine and writable disks.
func checkSavedState(s *savedState, version string, key []string, disks []string) error {
	switch {
	case s.QEMU != version:
		return fmt.Errorf("it was saved by QEMU %s and this host's QEMU is %s", s.QEMU, version)
	case s.Machine != hashArgs(key):
		return fmt.Errorf("the machine changed since it was saved (its size, disks, devices or accelerator: %s)", argvDiff(s.MachineArgs, key))
	}
	now, err := diskIDs(disks)
	if err != nil {
		return fmt.Errorf("its disk: %w", err)
	}
	if len(now) != len(s.Disks) {
		return fmt.Errorf("it was saved with %d writable disks, the machine has %d", len(s.Disks), len(now))
	}
	for i, d := range now {
		if d != s.Disks[i] {
			return fmt.Errorf("the disk %s changed since it was saved (size, time or file differ)", d.Path)
		}
	}
	return nil
}
