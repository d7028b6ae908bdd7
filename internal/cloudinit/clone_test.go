package cloudinit

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/personalize"
)

// TestPersonalizeIsShell checks the clone scripts parse as POSIX shell,
// and that Personalize hands the guest's agent-vm the VM's values as one
// JSON line in a quoted here-document, none of them as shell text.
func TestPersonalizeIsShell(t *testing.T) {
	c := testConfig(t)
	c.Hostname = "feat-x"
	c.Guidance = "it's `here` $(rm -rf /)\n" + planEnd + "\n"
	p, err := Personalize(c, make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	for name, script := range map[string]string{"Personalize": p, "FirstRun": FirstRun(c)} {
		out, err := exec.Command("sh", "-n", "-c", script).CombinedOutput()
		if err != nil {
			t.Errorf("%s is not valid shell: %v: %s\n%s", name, err, out, script)
		}
	}
	if strings.Contains(p, "rm -rf") || strings.Contains(p, strings.TrimSpace(c.HostKey.Private)) {
		t.Errorf("Personalize splices values into the script:\n%s", p)
	}
	// sh itself reads the here-document: exactly the plan, which decodes.
	out, err := exec.Command("sh", "-c", strings.Replace(p, personalize.Binary+" "+personalize.Command, "cat", 1)).Output()
	if err != nil {
		t.Fatal(err)
	}
	var plan personalize.Plan
	if err := json.Unmarshal(out, &plan); err != nil {
		t.Fatalf("the here-document is not the plan: %v\n%s", err, out)
	}
	if plan.Hostname != "feat-x" || len(plan.Entropy) != 32 || plan.SSHDPidFile == "" || plan.Token.From != fwCfgToken {
		t.Errorf("plan %+v", plan)
	}
	files := map[string]personalize.Entry{}
	for _, f := range plan.Files {
		files[f.Path] = f
	}
	if k := files["/etc/ssh/ssh_host_ed25519_key"]; k.Mode != 0o600 || k.UID != 0 || !strings.Contains(string(k.Content), "PRIVATE KEY") {
		t.Errorf("host key entry %+v", k)
	}
	if a := files[homeDir+"/.ssh/authorized_keys"]; a.UID != c.UID || a.GID != c.GID || a.Mode != 0o600 {
		t.Errorf("authorized_keys entry uid %d gid %d mode %o", a.UID, a.GID, a.Mode)
	}
	guidance := 0
	for _, f := range plan.Files {
		if strings.Contains(string(f.Content), "$(rm -rf /)") {
			guidance++
			if f.UID != c.UID {
				t.Errorf("guidance note %s is owned by %d, want dev (%d)", f.Path, f.UID, c.UID)
			}
		}
	}
	if guidance == 0 {
		t.Error("the plan writes no guidance notes")
	}
	if _, ok := files[etcDir+"/agent-mcp.env"]; !ok {
		t.Error("the plan does not write agent-mcp's settings")
	}
	if _, err := Personalize(c, make([]byte, 8)); err == nil {
		t.Error("Personalize took 8 bytes of entropy")
	}
	if !strings.Contains(FirstRun(c), libDir+"/provision") {
		t.Errorf("FirstRun does not provision:\n%s", FirstRun(c))
	}
}

// TestTemplateSeedLeavesVMWorkOut: a template's seed neither provisions
// the repository nor writes guidance notes; it installs its agent CLIs
// and packages, which its clones share.
func TestTemplateSeedLeavesVMWorkOut(t *testing.T) {
	c := testConfig(t)
	c.Template, c.Guidance, c.NPMPackages = true, "note", []string{"@anthropic-ai/claude-code"}
	c.ExtraPackages = []string{"ripgrep"}
	s, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	var ud struct {
		Runcmd [][]string `json:"runcmd"`
	}
	if err := json.Unmarshal(bytes.TrimPrefix(s.UserData, []byte("#cloud-config\n")), &ud); err != nil {
		t.Fatal(err)
	}
	runcmd, _ := json.Marshal(ud.Runcmd)
	if strings.Contains(string(runcmd), libDir+"/provision") {
		t.Errorf("the template seed's runcmd provisions a repository: %s", runcmd)
	}
	if !strings.Contains(string(runcmd), `__npm-install`) || !strings.Contains(string(runcmd), `"sh","@anthropic-ai/claude-code"]`) {
		t.Errorf("the template seed's runcmd does not install its agent CLI: %s", runcmd)
	}
	if !strings.Contains(string(runcmd), `"`+libDir+`/ensure-packages","ripgrep"]`) {
		t.Errorf("the template seed's runcmd does not install its packages: %s", runcmd)
	}
	if strings.Contains(string(s.UserData), `"note"`) {
		t.Error("the template seed writes guidance notes")
	}
}
