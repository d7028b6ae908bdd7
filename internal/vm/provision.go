package vm

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/repoconfig"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
)

// applyRepoConfig reads the repository's .agent-vm/config.toml from the
// new workspace l (the branch's commit): its packages join the record, and its defaults fill the
// create flags the user left unset, each checked as the flag would be, with
// errors naming the file (and, for packages, the line).
func (m *Manager) applyRepoConfig(o CreateOptions, l state.Layout, rec *state.Record, be backend.Backend) error {
	// The workspace is still in the staging directory: name the file as
	// git does, branch:path.
	c, err := repoconfig.Load(l.Workspace(), rec.Branch+":"+guest.ConfigFile)
	if err != nil {
		return err
	}
	if c.Path == "" {
		return nil
	}
	if err := checkRepoPackages(c, be); err != nil {
		return err
	}
	rec.RepoPackages = c.Packages
	d := o
	if d.CPUs == 0 {
		d.CPUs = c.CPUs
	}
	if d.MemoryMiB == 0 {
		d.MemoryMiB = c.MemoryMiB
	}
	if d.Agent == "" && c.Agent != "" {
		if err := be.CheckCreate(backend.CreateFlags{Agent: c.Agent}); err != nil {
			m.Log.Warn("not installing the agent the repository's config.toml names", "file", c.Path, "reason", err)
		} else {
			d.Agent = c.Agent
		}
	}
	if err := checkCreateFlags(d, m.Host()); err != nil {
		return fmt.Errorf("%s sets a default that does not fit: %w", c.Path, err)
	}
	if d.CPUs != 0 {
		rec.Resources.CPUs = d.CPUs
	}
	if d.MemoryMiB != 0 {
		rec.Resources.MemoryMiB = d.MemoryMiB
	}
	rec.Agent = d.Agent
	return nil
}

// checkRepoPackages checks each of the file's packages against the
// backend's grammar, naming the file and line of the first bad one.
func checkRepoPackages(c *repoconfig.Config, be backend.Backend) error {
	for _, p := range c.Packages {
		if err := be.CheckCreate(backend.CreateFlags{Packages: []string{p}}); err != nil {
			return fmt.Errorf("%s:%d: %w", c.Path, c.Line("packages", p), err)
		}
	}
	return nil
}

// ProvisionError is a boot whose run of the repository's provisioning
// (guest.ProvisionScript, the packages) failed. The VM is left running.
type ProvisionError struct {
	VM   string // the branch
	Slug string
	Exit int
	Tail string // the last lines of the guest's provisioning log
}

func (e *ProvisionError) Error() string {
	return fmt.Sprintf("%s: the repository's provisioning failed on its first boot (exit status %d)\nlast lines of %s in the guest:\n%s\n"+
		"(hint: the VM is running: `agent-vm logs %s` shows the whole log, `agent-vm shell %s` lets you look around; fix %s or the packages (.agent-vm/config.toml, create --packages), then `agent-vm reset --force %s` and `agent-vm start %s` provision a fresh disk)",
		e.VM, e.Exit, guest.ProvisionLog, indent(e.Tail), e.Slug, e.Slug, guest.ProvisionScript, e.Slug, e.Slug)
}

// provisionCheck prints the provisioning status file, the current boot id
// and, after a failure, the log's tail. Run as the guest user.
var provisionCheck = fmt.Sprintf(`cat %[1]s 2>/dev/null; echo "current=$(cat /proc/sys/kernel/random/boot_id)"; `+
	`if grep -qx status=failed %[1]s 2>/dev/null; then echo ---; tail -n 20 %[2]s 2>/dev/null; fi`,
	guest.ProvisionStatus, guest.ProvisionLog)

// checkProvision asks the guest how its provisioning went. A failure on
// this boot is a ProvisionError; one on an earlier boot (the VM was used
// since) is a warning; a guest that has not provisioned (an older VM, a
// check that cannot run) is nothing.
func (m *Manager) checkProvision(ctx context.Context, r *state.Record, l state.Layout) error {
	c, err := m.dialGuest(ctx, r, l)
	if err != nil {
		m.Log.Warn("could not ask the guest how its provisioning went", "error", err)
		return nil
	}
	defer c.Close()
	var out, errOut strings.Builder
	if _, err := sshx.Run(ctx, c, provisionCheck, nil, &out, &errOut); err != nil {
		m.Log.Warn("could not ask the guest how its provisioning went", "error", err)
		return nil
	}
	st := parseProvisionStatus(out.String())
	if st.status != "failed" {
		return nil
	}
	if st.boot != st.current {
		m.Log.Warn("the repository's provisioning failed on an earlier boot", "exit", st.exit,
			"hint", fmt.Sprintf("`agent-vm logs %s` shows its log; `agent-vm reset --force %s` provisions a fresh disk", r.Slug, r.Slug))
		return nil
	}
	return &ProvisionError{VM: r.Branch, Slug: r.Slug, Exit: st.exit, Tail: st.tail}
}

type provisionStatus struct {
	status, boot, current, tail string
	exit                        int
}

// parseProvisionStatus reads provisionCheck's output.
func parseProvisionStatus(s string) provisionStatus {
	var st provisionStatus
	head, tail, _ := strings.Cut(s, "---\n")
	st.tail = strings.TrimRight(tail, "\n")
	for _, line := range strings.Split(head, "\n") {
		k, v, _ := strings.Cut(line, "=")
		switch k {
		case "status":
			st.status = v
		case "exit":
			st.exit, _ = strconv.Atoi(v)
		case "boot":
			st.boot = v
		case "current":
			st.current = v
		}
	}
	return st
}
