package harness

import (
	"encoding/json"
	"strings"
	"testing"
)

func doctorFrom(t *testing.T, js string) host {
	t.Helper()
	var d doctorReport
	if err := json.Unmarshal([]byte(js), &d); err != nil {
		t.Fatal(err)
	}
	return host{doctor: &d}
}

func TestVMSkip(t *testing.T) {
	for _, c := range []struct {
		name, doctor string
		want         []string // "" = VMs can boot
	}{
		{"ready", `{"checks":[{"name":"qemu","ok":true}],"accel":"kvm","image":"/img","vm_ready":true}`, nil},
		{"no image", `{"checks":[{"name":"qemu","ok":true}],"accel":"tcg","image":"","vm_ready":false}`,
			[]string{"no base image", "sudo agent-vm image build"}},
		{"no qemu", `{"checks":[{"name":"qemu","ok":false,"detail":"qemu-system-x86_64 not found","hint":"apt-get install qemu-system-x86"},
			{"name":"image","ok":false,"detail":"no base image","hint":"sudo agent-vm image build"}],"image":"","vm_ready":false}`,
			[]string{"qemu: qemu-system-x86_64 not found (hint: apt-get install qemu-system-x86)", "image: no base image (hint: sudo agent-vm image build)"}},
		{"unexplained", `{"checks":[],"image":"/img","vm_ready":false}`, []string{"agent-vm doctor"}},
	} {
		got := doctorFrom(t, c.doctor).vmSkip()
		if c.want == nil && got != "" {
			t.Errorf("%s: vmSkip = %q, want VMs to boot", c.name, got)
		}
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: vmSkip = %q, want it to say %q", c.name, got, w)
			}
		}
		if c.name == "no qemu" && strings.Count(got, "image build") != 1 {
			t.Errorf("%s: the image hint is given twice: %q", c.name, got)
		}
	}
	if got := (host{noDoctor: "this agent-vm has no `doctor` command"}).vmSkip(); !strings.Contains(got, "no `doctor` command") {
		t.Errorf("without doctor: %q", got)
	}
}

func TestBackendSkip(t *testing.T) {
	h := doctorFrom(t, `{"checks":[{"name":"qemu","ok":true},{"name":"libvirt (qemu:///system)","ok":false,"detail":"libvirtd is not running","hint":"start it"}],
		"image":"/img","vm_ready":true,"backends":["qemu"]}`)
	got := h.backendSkip("vagrant")
	for _, w := range []string{"the vagrant backend cannot run here", "libvirt (qemu:///system) (hint: start it)"} {
		if !strings.Contains(got, w) {
			t.Errorf("backendSkip(vagrant) = %q, want it to say %q", got, w)
		}
	}
	for _, b := range []string{"qemu", "auto", ""} {
		if got := h.backendSkip(b); got != "" {
			t.Errorf("backendSkip(%q) = %q, want none", b, got)
		}
	}
}

func TestDescribe(t *testing.T) {
	lines := strings.Join(doctorFrom(t, `{"accel":"tcg","accel_reason":"KVM hangs","image":"/img","vm_ready":true}`).describe(), "\n")
	for _, w := range []string{"accel tcg (KVM hangs)", "base image /img", "VMs can boot here"} {
		if !strings.Contains(lines, w) {
			t.Errorf("describe lacks %q:\n%s", w, lines)
		}
	}
}

func TestMissingVerbs(t *testing.T) {
	h := host{verbs: map[string]bool{"create": true, "start": false}}
	if got := strings.Join(h.missingVerbs([]string{"stop", "create", "start"}), ","); got != "start,stop" {
		t.Errorf("missingVerbs = %q, want start,stop", got)
	}
}

func TestHelpCommands(t *testing.T) {
	help := "NAME:\n   agent-vm - x\n\nCOMMANDS:\n   create      create a VM\n   list, ls    list the VMs\n" +
		"   exec        run a command in the VM's /workspace; its exit status becomes agent-vm's\n\nGLOBAL OPTIONS:\n   --state-dir value\n"
	got := helpCommands(help)
	for _, v := range []string{"create", "list", "ls", "exec"} {
		if !got[v] {
			t.Errorf("%q not found in %v", v, got)
		}
	}
	if got["start"] || got["--state-dir"] || len(got) != 4 {
		t.Errorf("commands %v, want create, list, ls, exec", got)
	}
	categories := "COMMANDS:\n   Images and templates:\n     image     the base disk images\n   VMs:\n     create  create a VM\n\nGLOBAL OPTIONS:\n"
	if got := helpCommands(categories); len(got) != 2 || !got["image"] || !got["create"] {
		t.Errorf("commands under categories: %v, want image, create", got)
	}
	if helpCommands("usage: x\n") != nil {
		t.Error("a help text without COMMANDS gave a list")
	}
}
