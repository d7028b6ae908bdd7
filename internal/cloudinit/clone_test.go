package cloudinit

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// TestPersonalizeIsShell checks the clone scripts parse as POSIX shell
// and carry the VM's values only base64-encoded.
func TestPersonalizeIsShell(t *testing.T) {
	c := testConfig(t)
	c.Hostname = "feat-x"
	c.Guidance = "it's `here` $(rm -rf /)"
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
	if strings.Contains(p, "rm -rf") || strings.Contains(p, c.HostKey.Private) {
		t.Errorf("Personalize splices values into the script:\n%s", p)
	}
	if _, err := Personalize(c, make([]byte, 8)); err == nil {
		t.Error("Personalize took 8 bytes of entropy")
	}
	if !strings.Contains(FirstRun(c), libDir+"/provision") {
		t.Errorf("FirstRun does not provision:\n%s", FirstRun(c))
	}
}

// TestTemplateSeedLeavesVMWorkOut: a template's seed neither provisions
// the repository nor writes guidance notes.
func TestTemplateSeedLeavesVMWorkOut(t *testing.T) {
	c := testConfig(t)
	c.Template, c.Guidance, c.NPMPackages = true, "note", []string{"@anthropic-ai/claude-code"}
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
	for _, no := range []string{libDir + "/provision", "claude-code"} {
		if strings.Contains(string(runcmd), no) {
			t.Errorf("the template seed's runcmd has %s: %s", no, runcmd)
		}
	}
	if strings.Contains(string(s.UserData), `"note"`) {
		t.Error("the template seed writes guidance notes")
	}
}
