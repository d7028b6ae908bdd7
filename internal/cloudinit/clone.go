package cloudinit

// A clone: a guest restored from a template's saved state (see internal/vm's
// template.go) rather than booted with its own seed. The template was
// provisioned by a seed rendered with Config.Template: the generic part of
// the guest contract (user dev, sshd, the agent-vm units, the egress proxy's
// settings, the host's CA certificates) and none of a VM's own. Personalize
// renders what that first boot would have done for one VM, as a root shell
// script run over SSH with the template's key, before the workspace is
// plugged in; FirstRun renders the rest, which needs the workspace (the
// agent CLI, the repository's provisioning).
//
// Values reach the scripts base64-encoded (printf %s 'QUJD' | base64 -d),
// never spliced in as shell text.

import (
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// fwCfgToken is where the guest's fw_cfg driver shows the MCP token QEMU
// passes (MCPTokenFwCfgName).
const fwCfgToken = "/sys/firmware/qemu_fw_cfg/by_name/" + MCPTokenFwCfgName + "/raw"

// Personalize renders the root script that makes a guest restored from a
// template c's VM: c's host key and authorized keys only (the template's
// key stops working), a new machine-id, c's hostname and instance-id (so
// that the guest's later cold boots, with c's own seed, do not provision
// it again), the kernel RNG reseeded with entropy (host randomness; QEMU's
// vmgenid has reseeded it already where the guest kernel has the driver),
// agent-mcp's settings and the MCP token QEMU passes this VM. sshd
// restarts last: the running session survives, new ones need c's keys.
// The script holds the host's private key: it goes over SSH only.
func Personalize(c Config, entropy []byte) (string, error) {
	if err := c.Validate(); err != nil {
		return "", err
	}
	if len(entropy) < 32 {
		return "", fmt.Errorf("internal error: %d bytes of entropy, want at least 32", len(entropy))
	}
	files, err := guestFiles(c)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("set -eu\n")
	// RNDADDENTROPY (credited) then RNDRESEEDCRNG: the next random number
	// the guest draws depends on the host's bytes, not only on the
	// template's pool.
	fmt.Fprintf(&b, `python3 -c '
import base64, fcntl, os, struct, sys
d = base64.b64decode(sys.argv[1])
fd = os.open("/dev/random", os.O_WRONLY)
fcntl.ioctl(fd, 0x40085203, struct.pack("ii", len(d) * 8, len(d)) + d)
fcntl.ioctl(fd, 0x5207)
' %s
`, b64(entropy))
	b.WriteString("dec() { printf %s \"$1\" | base64 -d; }\n")
	put := func(path, owner, mode string, content []byte) {
		fmt.Fprintf(&b, "dec %s >%s.new && chown %s %s.new && chmod %s %s.new && mv -f %s.new %s\n",
			b64(content), path, owner, path, mode, path, path, path)
	}
	// Identity.
	b.WriteString("umask 077\nrm -f /etc/ssh/ssh_host_*\n")
	put("/etc/ssh/ssh_host_ed25519_key", "root:root", "0600", []byte(strings.TrimSpace(c.HostKey.Private)+"\n"))
	put("/etc/ssh/ssh_host_ed25519_key.pub", "root:root", "0644", []byte(c.HostKey.Public+"\n"))
	put(homeDir+"/.ssh/authorized_keys", UserName+":"+UserName, "0600", []byte(strings.Join(c.AuthorizedKeys, "\n")+"\n"))
	b.WriteString("umask 022\n")
	b.WriteString("systemd-id128 new >/etc/machine-id.new && mv -f /etc/machine-id.new /etc/machine-id\n")
	b.WriteString("if [ -f /var/lib/dbus/machine-id ] && [ ! -L /var/lib/dbus/machine-id ]; then cp /etc/machine-id /var/lib/dbus/machine-id; fi\n")
	// Not hostnamectl: starting systemd-hostnamed over D-Bus costs seconds
	// under TCG.
	fmt.Fprintf(&b, "h=$(dec %s)\nprintf '%%s\\n' \"$h\" >/etc/hostname\nhostname \"$h\"\n", b64([]byte(c.Hostname)))
	b.WriteString("sed -i '/^127\\.0\\.1\\.1[[:space:]]/d' /etc/hosts && printf '127.0.1.1 %s\\n' \"$h\" >>/etc/hosts\n")
	put("/var/lib/cloud/data/instance-id", "root:root", "0644", []byte(c.InstanceID+"\n"))
	// agent-mcp's settings, as the seed writes them.
	for _, f := range files {
		if f.Path != etcDir+"/agent-mcp.env" && f.Path != etcDir+"/mcp.json" {
			continue
		}
		content := []byte(f.Content)
		if f.Encoding == "b64" {
			if content, err = base64.StdEncoding.DecodeString(f.Content); err != nil {
				return "", fmt.Errorf("internal error: %w", err)
			}
		}
		put(f.Path, f.Owner, f.Permissions, content)
	}
	for _, f := range guidanceFiles(c) {
		if dir := f.Path[:strings.LastIndex(f.Path, "/")]; dir != homeDir {
			fmt.Fprintf(&b, "install -d -o %s -g %s %s\n", UserName, UserName, dir)
		}
		put(f.Path, UserName+":"+UserName, f.Permissions, []byte(f.Content))
	}
	// The token of this VM's QEMU (setup.sh's install_token read the
	// template's at its boot).
	b.WriteString("[ -d /sys/firmware/qemu_fw_cfg ] || modprobe -q qemu_fw_cfg || true\n")
	fmt.Fprintf(&b, "umask 077\nmkdir -p /run/agent-vm\ncat %s >/run/agent-vm/mcp-token.new\n", fwCfgToken)
	b.WriteString("[ -s /run/agent-vm/mcp-token.new ] || { echo 'no MCP token in fw_cfg' >&2; exit 1; }\n")
	b.WriteString("mv -f /run/agent-vm/mcp-token.new /run/agent-vm/mcp-token\n")
	// journald takes the new machine-id when it restarts, which need not
	// hold the caller up; sshd must present the new host key before the
	// caller reconnects.
	b.WriteString("systemctl restart --no-block systemd-journald\nsystemctl restart ssh\n")
	return b.String(), nil
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

func b64(b []byte) string { return execx.ShellQuote(base64.StdEncoding.EncodeToString(b)) }
