package cloudinit

// A clone: a guest restored from a template's saved state (see
// internal/template) rather than booted with its own seed. The template was
// provisioned by a seed rendered with Config.Template: the generic part of
// the guest contract (user dev, sshd, the agent-vm units, the egress proxy's
// settings, the host's CA certificates) and none of a VM's own. Personalize
// renders what that first boot would have done for one VM, as a root shell
// script run over SSH with the template's key, before the workspace is
// plugged in; FirstRun renders the rest, which needs the workspace (the
// agent CLI, the repository's provisioning).
//
// Values never reach the scripts as shell text: Personalize's go as a
// JSON plan in a quoted here-document, FirstRun's arguments quoted.

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/personalize"
)

// fwCfgToken is where the guest's fw_cfg driver shows the MCP token QEMU
// passes (MCPTokenFwCfgName).
const fwCfgToken = "/sys/firmware/qemu_fw_cfg/by_name/" + MCPTokenFwCfgName + "/raw"

// Personalize renders the root script that makes a guest restored from a
// template c's VM: it hands the guest's agent-vm (the template's key
// includes its binary, so the guest has this one's commands) the plan
// (internal/personalize): c's host key and authorized keys only (the
// template's key stops working), a new machine-id, c's hostname and
// instance-id (so that the guest's later cold boots, with c's own seed, do
// not provision it again), the kernel RNG reseeded with entropy (host
// randomness), agent-mcp's settings and guidance notes, the MCP token QEMU
// passes this VM, journald restarted, and the SSH connections the saved
// machine had ended: the running session survives, new ones need c's keys
// (sshd reads its host key for each connection). The plan travels as one
// JSON line in a quoted here-document (nothing in it is expanded); the host's
// private key in it only base64-encoded, over SSH only.
func Personalize(c Config, entropy []byte) (string, error) {
	p, err := personalizePlan(c, entropy)
	if err != nil {
		return "", err
	}
	plan, err := json.Marshal(p)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("set -eu\n%s %s <<'%s'\n%s\n%s\n", personalize.Binary, personalize.Command, planEnd, plan, planEnd), nil
}

// planEnd ends the plan's here-document; a JSON line cannot be it.
const planEnd = "AGENT_VM_PLAN"

// personalizePlan is what Personalize hands the guest.
func personalizePlan(c Config, entropy []byte) (personalize.Plan, error) {
	if err := c.Validate(); err != nil {
		return personalize.Plan{}, err
	}
	if len(entropy) < 32 {
		return personalize.Plan{}, fmt.Errorf("internal error: %d bytes of entropy, want at least 32", len(entropy))
	}
	files, err := guestFiles(c)
	if err != nil {
		return personalize.Plan{}, err
	}
	root, dev := personalize.Entry{UID: 0, GID: 0}, personalize.Entry{UID: c.UID, GID: c.GID}
	file := func(owner personalize.Entry, path string, mode os.FileMode, content []byte) personalize.Entry {
		owner.Path, owner.Mode, owner.Content = path, mode, content
		return owner
	}
	p := personalize.Plan{
		Entropy: entropy,
		Remove:  []string{"/etc/ssh/ssh_host_*"},
		Files: []personalize.Entry{
			file(root, "/etc/ssh/ssh_host_ed25519_key", 0o600, []byte(strings.TrimSpace(c.HostKey.Private)+"\n")),
			file(root, "/etc/ssh/ssh_host_ed25519_key.pub", 0o644, []byte(c.HostKey.Public+"\n")),
			file(dev, homeDir+"/.ssh/authorized_keys", 0o600, []byte(strings.Join(c.AuthorizedKeys, "\n")+"\n")),
			file(root, "/var/lib/cloud/data/instance-id", 0o644, []byte(c.InstanceID+"\n")),
		},
		Hostname: c.Hostname,
		Token:    personalize.Copy{From: fwCfgToken, To: "/run/agent-vm/mcp-token"},
		Restart:  []string{"systemd-journald"},
		// Debian's sshd writes its listener's pid there.
		SSHDPidFile: "/run/sshd.pid",
	}
	// agent-mcp's settings, as the seed writes them.
	for _, f := range files {
		if f.Path != etcDir+"/agent-mcp.env" && f.Path != etcDir+"/mcp.json" {
			continue
		}
		e, err := planEntry(c, f)
		if err != nil {
			return personalize.Plan{}, err
		}
		p.Files = append(p.Files, e)
	}
	for _, f := range guidanceFiles(c) {
		if dir := path.Dir(f.Path); dir != homeDir {
			p.Dirs = append(p.Dirs, personalize.Entry{Path: dir, UID: c.UID, GID: c.GID, Mode: 0o755})
		}
		f.Owner = UserName + ":" + UserName
		e, err := planEntry(c, f)
		if err != nil {
			return personalize.Plan{}, err
		}
		p.Files = append(p.Files, e)
	}
	return p, nil
}

// planEntry is a seed file as a plan's file: its owner (root or dev) and
// mode as numbers, its content decoded.
func planEntry(c Config, f writeFile) (personalize.Entry, error) {
	e := personalize.Entry{Path: f.Path, Content: []byte(f.Content)}
	ids := map[string]int{"root": 0, UserName: c.UID}
	user, group, _ := strings.Cut(f.Owner, ":")
	uid, ok1 := ids[user]
	gid, ok2 := ids[group]
	if group == UserName {
		gid = c.GID
	}
	if !ok1 || !ok2 {
		return e, fmt.Errorf("internal error: %s is owned by %q", f.Path, f.Owner)
	}
	e.UID, e.GID = uid, gid
	mode, err := strconv.ParseUint(f.Permissions, 8, 32)
	if err != nil {
		return e, fmt.Errorf("internal error: %s has permissions %q", f.Path, f.Permissions)
	}
	e.Mode = os.FileMode(mode)
	if f.Encoding == "b64" {
		if e.Content, err = base64.StdEncoding.DecodeString(f.Content); err != nil {
			return e, fmt.Errorf("internal error: %w", err)
		}
	}
	return e, nil
}

// FirstRunInstalls reports whether c's FirstRun installs anything (an
// agent CLI from npm, Debian packages): minutes under TCG.
func FirstRunInstalls(c Config) bool {
	return len(c.NPMPackages) > 0 || len(c.NPMPrograms) > 0 || len(c.ExtraPackages) > 0
}

// FirstRun renders the root script that finishes a clone once its
// workspace is mounted: what the first boot's runcmd does after the
// template's part (the agent CLI, the guidance notes' owner, the
// repository's packages and .agent-vm/provision.sh). It exits with the
// first failing command's status, as runcmd would log it.
func FirstRun(c Config) string {
	var b strings.Builder
	b.WriteString("set -eu\n")
	c.Template = false
	for _, cmd := range vmRuncmd(c) {
		var q []string
		for _, a := range cmd {
			q = append(q, execx.ShellQuote(a))
		}
		b.WriteString(strings.Join(q, " ") + "\n")
	}
	return b.String()
}
