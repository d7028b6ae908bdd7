package hostdir

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// The table: as root /var/lib/agent-vm 0711, with vagrant's directories
// and the registry in it; the cache 0711 with the templates 0700 and the
// images 0755 in it; the egress directory 0711 and strict.
func TestTheTable(t *testing.T) {
	getenv := func(k string) string { return map[string]string{"HOME": "/home/u"}[k] }
	h := NewTable(Roots{}, getenv, 0)
	for _, c := range []struct {
		d      *Dir
		path   string
		mode   fs.FileMode
		parent *Dir
	}{
		{h.Lib, "/var/lib/agent-vm", 0o711, nil},
		{h.Registry, "/var/lib/agent-vm/state-dirs", 0o700, h.Lib},
		{h.Handoff, "/var/lib/agent-vm/libvirt", 0o711, h.Lib},
		{h.Pool, "/var/lib/agent-vm/pool", 0o711, h.Lib},
		{h.VagrantHome, "/var/lib/agent-vm/vagrant", 0o755, h.Lib},
		{h.Cache, "/home/u/.cache/agent-vm", 0o711, nil},
		{h.Templates, "/home/u/.cache/agent-vm/templates", 0o700, h.Cache},
		{h.Images, "/home/u/.cache/agent-vm/images", 0o755, h.Cache},
	} {
		if c.d.Path != c.path || c.d.Mode != c.mode || c.d.Parent != c.parent {
			t.Errorf("%s %04o in %v; want %s %04o in %v", c.d.Path, c.d.Mode, c.d.Parent, c.path, c.mode, c.parent)
		}
	}
	if e := h.Egress; (e.Path != "/run/agent-vm-egress" && e.Path != filepath.Join(os.TempDir(), "agent-vm-egress")) || e.Mode != 0o711 || !e.Shared {
		t.Errorf("egress %s %04o shared %v; want /run/agent-vm-egress 0711, shared", e.Path, e.Mode, e.Shared)
	}
	if d := h.Config; d.Path != "/home/u/.config/agent-vm" || d.Mode != 0o700 || d.Parent != nil {
		t.Errorf("config %s %04o in %v; want /home/u/.config/agent-vm 0700, a top directory", d.Path, d.Mode, d.Parent)
	}
	if d := h.Secrets; d.Path != "/home/u/.config/agent-vm/secrets" || d.Mode != 0o700 || d.Parent != h.Config {
		t.Errorf("secrets %s %04o in %v; want /home/u/.config/agent-vm/secrets 0700 in ~/.config/agent-vm 0700", d.Path, d.Mode, d.Parent)
	}
	if d := h.Hosts; d.Path != "/home/u/.config/agent-vm/hosts" || d.Mode != 0o700 || d.Parent == nil || d.Parent.Path != "/home/u/.config/agent-vm" || d.Parent.Mode != 0o700 {
		t.Errorf("hosts %s %04o in %v; want /home/u/.config/agent-vm/hosts 0700 in ~/.config/agent-vm 0700", d.Path, d.Mode, d.Parent)
	}
	if d := NewTable(Roots{}, func(k string) string { return map[string]string{"HOME": "/home/u", "XDG_CONFIG_HOME": "/cfg"}[k] }, 1000).Hosts; d.Path != "/cfg/agent-vm/hosts" {
		t.Errorf("with XDG_CONFIG_HOME=/cfg: hosts %s, want /cfg/agent-vm/hosts", d.Path)
	}
	if d := h.Browser; d.Path != "/home/u/.local/share/agent-vm/browser" || d.Mode != 0o700 || d.Parent == nil || d.Parent.Path != "/home/u/.local/share/agent-vm" || d.Parent.Mode != 0o700 {
		t.Errorf("browser %s %04o in %v; want /home/u/.local/share/agent-vm/browser 0700 in ~/.local/share/agent-vm 0700", d.Path, d.Mode, d.Parent)
	}
	if d := NewTable(Roots{}, func(k string) string { return map[string]string{"HOME": "/home/u", "XDG_DATA_HOME": "/data"}[k] }, 1000).Browser; d.Path != "/data/agent-vm/browser" {
		t.Errorf("with XDG_DATA_HOME=/data: browser %s, want /data/agent-vm/browser", d.Path)
	}
	own := NewTable(Roots{}, func(k string) string {
		return map[string]string{"HOME": "/home/u", "AGENT_VM_TEMPLATE_DIR": "/tmp/t"}[k]
	}, 1000)
	if d := own.Templates; d.Path != "/tmp/t" || d.Mode != 0o700 || d.Parent != nil {
		t.Errorf("with AGENT_VM_TEMPLATE_DIR: templates %s %04o in %v; want /tmp/t 0700", d.Path, d.Mode, d.Parent)
	}
	user := NewTable(Roots{}, getenv, 1000)
	if user.Handoff != nil || user.Pool != nil || user.VagrantHome.Parent != user.Cache || user.Registry.Path != "/home/u/.local/state/agent-vm/state-dirs" {
		t.Errorf("as a user: handoff %v, VAGRANT_HOME in %v, registry %s; want none, the cache, ~/.local/state/agent-vm/state-dirs",
			user.Handoff, user.VagrantHome.Parent, user.Registry.Path)
	}
}
