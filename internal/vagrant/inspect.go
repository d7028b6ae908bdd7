package vagrant

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/driver"
)

// CacheTTL is how long Inspect trusts a vagrant status (see the package
// doc for the choice).
const CacheTTL = 15 * time.Second

// cached is the status cache file.
type cached struct {
	At     time.Time `json:"at"`
	Status Status    `json:"status"`
}

// Inspect reads the machine's state from vagrant, or from a status read
// less than CacheTTL ago. A cached running or paused machine is checked
// with libvirt (virsh domstate, fast): a machine killed since is read
// afresh, so a crash shows at once.
func (d *Driver) Inspect(ctx context.Context, m driver.Machine) (driver.Live, error) {
	var c cached
	if err := readJSON(runFile(m, CacheFile), &c); err == nil {
		if age := d.now().Sub(c.At); age >= 0 && age < CacheTTL {
			if lv := d.live(m, c.Status); !lv.Alive() || d.Running(m, nil) {
				return lv, nil
			}
		}
	}
	st, err := d.status(ctx, m)
	if err != nil {
		return driver.Live{}, err
	}
	if err := writeJSON(runFile(m, CacheFile), cached{At: d.now().UTC(), Status: st}); err != nil {
		d.Log.Debug("could not cache vagrant's status", "vm", m.Name, "error", err)
	}
	return d.live(m, st), nil
}

// fresh reads the state from vagrant, dropping the cache: what every
// lifecycle verb acts on.
func (d *Driver) fresh(ctx context.Context, m driver.Machine) (driver.Live, error) {
	removeMarkers(m, CacheFile)
	st, err := d.status(ctx, m)
	if err != nil {
		return driver.Live{}, err
	}
	return d.live(m, st), nil
}

// status runs `vagrant status --machine-readable` for m. A machine with no
// Vagrantfile yet is not created.
func (d *Driver) status(ctx context.Context, m driver.Machine) (Status, error) {
	if _, err := os.Stat(Project(m.RunDir)); errors.Is(err, os.ErrNotExist) {
		return Status{State: "not_created"}, nil
	}
	name := MachineName(m)
	res, err := d.vagrant(ctx, m, false, "status", "--machine-readable", name)
	if err != nil {
		if st, perr := ParseStatus(res.Stdout, name); perr != nil && len(res.Stdout) > 0 {
			return st, fmt.Errorf("%w: %v", err, perr)
		}
		return Status{}, err
	}
	st, err := ParseStatus(res.Stdout, name)
	if err != nil {
		return st, err
	}
	switch st.State {
	case "shutoff", "poweroff", "paused":
		if st.Provider != "" && st.Provider != "libvirt" {
			break // libvirt knows nothing of another provider's machine
		}
		if ds, err := d.domState(ctx, m); err != nil {
			d.Log.Debug("libvirt could not say why the machine is off", "vm", m.Name, "error", err)
		} else {
			st.Reason = ds.Reason
		}
	}
	return st, nil
}

// live maps vagrant's state to the driver's, with agent-vm's markers
// telling a halt from a kill and a suspend from a halt.
func (d *Driver) live(m driver.Machine, st Status) driver.Live {
	var launch *driver.Launch
	var l driver.Launch
	err := readJSON(runFile(m, LaunchFile), &l)
	if err == nil {
		launch = &l
	} else if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	lv := driver.Live{Launch: launch, LaunchErr: err}
	logs := d.Logs(m)
	recover := fmt.Sprintf("`agent-vm start %s` recovers it; see %s and %s", short(m), logs.Console, logs.Driver)
	switch st.State {
	case "running", "preparing", "inaccessible", "blocked", "shutting_down":
		lv.State, lv.Pid = driver.StateRunning, d.qemuPid(m)
		if st.State != "running" {
			lv.Detail = "vagrant says: " + strings.ReplaceAll(st.State, "_", " ")
		}
	case "paused":
		lv.State, lv.Pid = driver.StatePaused, d.qemuPid(m)
		if exists(runFile(m, SuspendMark)) {
			lv.State, lv.Suspend, lv.Detail = driver.StateSuspended, driver.SuspendPaused, "paused by `agent-vm suspend`: no guest code runs, but its QEMU still holds its memory (vagrant-libvirt's suspend pauses); `agent-vm resume "+short(m)+"` continues it"
		}
	case "saved":
		lv.State, lv.Suspend = driver.StateSuspended, driver.SuspendSaved
	case "pmsuspended": // the guest suspended itself to RAM: its QEMU holds it
		lv.State, lv.Suspend = driver.StateSuspended, driver.SuspendPaused
	case "not_created":
		lv.State, lv.Detail = driver.StateStopped, "not created yet: the first start runs `vagrant up`"
	case "shutoff", "poweroff":
		clean := exists(runFile(m, CleanMarker))
		switch {
		case st.Reason == "crashed":
			lv.State, lv.Detail = driver.StateCrashed, "libvirt says its QEMU crashed or was killed; "+recover
		case st.Reason == "saved":
			lv.State, lv.Suspend, lv.Detail = driver.StateSuspended, driver.SuspendSaved, "libvirt keeps its memory saved on disk"
		case st.Reason == "destroyed" && !clean && launch != nil:
			lv.State, lv.Detail = driver.StateCrashed, "libvirt says it was forced off, not by agent-vm; "+recover
		case st.Reason == "shutdown" && !clean && launch != nil:
			lv.State, lv.Detail = driver.StateStopped, "the guest powered itself off"
		case launch == nil || clean:
			lv.State = driver.StateStopped
		case strings.Contains(driver.TailFile(logs.Console, 3), driver.PowerOffMarker):
			lv.State, lv.Detail = driver.StateStopped, "the guest powered itself off"
		default:
			lv.State, lv.Detail = driver.StateCrashed, "the machine is off without agent-vm stopping it (killed, or its guest crashed); "+recover
		}
	case "aborted", "crashed":
		lv.State, lv.Detail = driver.StateCrashed, "vagrant says "+st.State+"; "+recover
	default:
		lv.State, lv.Detail = driver.StateCrashed, fmt.Sprintf("vagrant reports the unknown state %q; %s", st.State, recover)
	}
	return lv
}

// short is the VM's name as the user types it.
func short(m driver.Machine) string { return strings.TrimPrefix(m.Name, "agent-vm-") }

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func writeJSON(path string, v any) error { return atomicfile.WriteJSON(path, v, 0o600) }
