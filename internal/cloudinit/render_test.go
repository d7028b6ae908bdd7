package cloudinit

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// goldenCases are the representative records whose rendering is pinned in
// testdata/golden/<name>/ (regenerate: AGENT_VM_UPDATE_GOLDEN=1 go test
// ./internal/cloudinit).
func goldenCases(t testing.TB) map[string]Config {
	t.Helper()
	base := testConfig(t)

	custom := testConfig(t)
	custom.InstanceID = "bugfix-2-reprovision-3"
	custom.Hostname = "bugfix-2"
	custom.UID, custom.GID = 1234567, 100 // an LDAP-style uid, a shared "users" gid
	custom.AuthorizedKeys = append(custom.AuthorizedKeys, strings.TrimSpace(readFixture(t, "other_ed25519.pub")))
	custom.MCP = MCP{
		Port:         9000,
		AllowOrigins: []string{"https://claude.ai", "http://localhost:6274"},
		Config:       []byte(`{"mcpServers": {"fs": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/workspace"], "env": {"GREETING": "grüß dich 🙂"}}}}`),
	}
	custom.ExtraPackages = []string{"ripgrep", "python3-venv"}
	custom.MACAddress = "52:54:00:ab:cd:ef"
	custom.CACerts = []string{readFixture(t, "host-ca.pem")}
	custom.NPMPackages = []string{"@anthropic-ai/claude-code"}
	custom.NPMPrograms = []string{"@anthropic-ai/claude-code-linux-x64@2.1.332"}
	custom.Guidance = "# You are working in an agent-vm virtual machine\n\nOn the branch `bugfix/2`: \"quotes\", $HOME and ${x} stay text.\n"

	return map[string]Config{
		"uid-1000":                base,
		"custom-ids-with-origins": custom,
	}
}

func TestGoldens(t *testing.T) {
	for name, c := range goldenCases(t) {
		t.Run(name, func(t *testing.T) {
			seed, err := Render(c)
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			dir := filepath.Join("testdata", "golden", name)
			docs := map[string][]byte{"user-data": seed.UserData, "meta-data": seed.MetaData, "network-config": seed.NetworkConfig}
			for file, got := range docs {
				testutil.Golden(t, filepath.Join(dir, file), got)
			}
		})
	}
}

// parseUserData reads user-data back as JSON, which it must also be.
func parseUserData(t testing.TB, b []byte) userData {
	t.Helper()
	body, ok := bytes.CutPrefix(b, []byte("#cloud-config\n"))
	if !ok {
		t.Fatalf("user-data does not start with #cloud-config:\n%s", b)
	}
	var ud userData
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ud); err != nil {
		t.Fatalf("user-data is not the JSON we meant: %v", err)
	}
	return ud
}

func TestUserDataCarriesTheGuestContract(t *testing.T) {
	c := goldenCases(t)["custom-ids-with-origins"]
	seed, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	ud := parseUserData(t, seed.UserData)

	if len(ud.Users) != 1 {
		t.Fatalf("users: got %d, want only dev (no distro default user)", len(ud.Users))
	}
	u := ud.Users[0]
	if u.Name != "dev" || u.UID != 1234567 || u.PrimaryGroup != "dev" || u.Shell != "/bin/bash" ||
		u.Sudo != "ALL=(ALL) NOPASSWD:ALL" || !u.LockPasswd || !slices.Equal(u.SSHAuthorizedKeys, c.AuthorizedKeys) {
		t.Errorf("user dev: got %+v", u)
	}
	if !slices.Contains(ud.Bootcmd[0], "100") || !strings.Contains(strings.Join(ud.Bootcmd[0], " "), "groupadd --gid") {
		t.Errorf("bootcmd does not create dev's group with gid 100: %q", ud.Bootcmd[0])
	}
	if ud.SSHKeys.Ed25519Private != c.HostKey.Private || ud.SSHKeys.Ed25519Public != c.HostKey.Public {
		t.Error("ssh_keys does not carry the pinned host key")
	}
	if !ud.SSHDeleteKeys || !slices.Equal(ud.SSHGenKeyTypes, []string{"ed25519"}) || !ud.DisableRoot {
		t.Errorf("ssh settings: deletekeys %v genkeytypes %q disable_root %v", ud.SSHDeleteKeys, ud.SSHGenKeyTypes, ud.DisableRoot)
	}
	// ssh_pwauth would make cloud-init restart sshd in its config stage,
	// resetting the SSH sessions of a just-started VM.
	if strings.Contains(string(seed.UserData), "ssh_pwauth") {
		t.Error("user-data sets ssh_pwauth")
	}
	if ud.Hostname != "bugfix-2" || ud.PreserveHostname {
		t.Errorf("hostname: got %q (preserve %v)", ud.Hostname, ud.PreserveHostname)
	}
	if last := ud.Runcmd[len(ud.Runcmd)-1]; !slices.Equal(last, []string{"touch", "/etc/cloud/cloud-init.disabled"}) {
		t.Errorf("the last runcmd is %q; the first boot must end by switching cloud-init off", last)
	}
	if got := ud.Runcmd[0]; !slices.Equal(got[1:], []string{"git", "nodejs", "npm"}) {
		t.Errorf("agent packages: got %q", got)
	}
	// The extra packages are the provisioning's first step, so a failed
	// install shows in its log and status; it runs before the units are
	// enabled and cloud-init is switched off.
	provision := ud.Runcmd[len(ud.Runcmd)-3]
	if !slices.Equal(provision, withProxy([]string{libDir + "/provision", libDir + "/ensure-packages", "ripgrep", "python3-venv"})) {
		t.Errorf("provisioning: got %q", provision)
	}

	files := map[string]writeFile{}
	for _, f := range ud.WriteFiles {
		files[f.Path] = f
	}
	// Every tool in the guest is told the egress proxy's address, which
	// the static files spell out: it must be the guest contract's.
	for _, p := range []string{"/etc/environment", "/etc/apt/apt.conf.d/80agent-vm-proxy", "/etc/npmrc", "/etc/gitconfig", "/etc/pip.conf", "/etc/systemd/system.conf.d/50-agent-vm-proxy.conf"} {
		if !strings.Contains(files[p].Content, guest.ProxyURL) {
			t.Errorf("%s does not name the proxy %s: %q", p, guest.ProxyURL, files[p].Content)
		}
	}
	if f := files["/etc/environment"]; !f.Append || !strings.Contains(f.Content, "no_proxy="+guest.NoProxy+"\n") {
		t.Errorf("/etc/environment: append %v, %q; want the proxy appended, with no_proxy %s", f.Append, f.Content, guest.NoProxy)
	}
	env := files["/etc/agent-vm/agent-mcp.env"].Content
	for _, want := range []string{"AGENT_MCP_PORT=9000\n", `AGENT_MCP_ALLOW_ORIGINS="https://claude.ai http://localhost:6274"`} {
		if !strings.Contains(env, want) {
			t.Errorf("agent-mcp.env lacks %q:\n%s", want, env)
		}
	}
	mcp := files["/etc/agent-vm/mcp.json"]
	decoded, err := base64.StdEncoding.DecodeString(mcp.Content)
	if err != nil || !bytes.Equal(decoded, c.MCP.Config) || mcp.Owner != "root:dev" || mcp.Permissions != "0640" {
		t.Errorf("mcp.json: got %+v (decoded %q, %v)", mcp, decoded, err)
	}
	for _, p := range []string{
		"/etc/systemd/system/agent-mcp.service", "/etc/systemd/system/agent-vm-setup.service",
		"/etc/systemd/system/agent-vm-workspace.service", "/etc/ssh/sshd_config.d/50-agent-vm.conf",
		"/usr/local/lib/agent-vm/setup", "/usr/local/lib/agent-vm/mount-workspace",
		"/usr/local/lib/agent-vm/agent-mcp-start", "/usr/local/lib/agent-vm/ensure-packages",
	} {
		if _, ok := files[p]; !ok {
			t.Errorf("write_files lacks %s", p)
		}
	}

	var md metaData
	if err := json.Unmarshal(seed.MetaData, &md); err != nil || md.InstanceID != c.InstanceID || md.LocalHostname != c.Hostname {
		t.Errorf("meta-data: got %+v (%v)", md, err)
	}
	var nc networkConfig
	if err := json.Unmarshal(seed.NetworkConfig, &nc); err != nil || nc.Version != 2 || nc.Ethernets["nic0"].Match.MACAddress != "52:54:00:ab:cd:ef" || !nc.Ethernets["nic0"].DHCP4 {
		t.Errorf("network-config: got %+v (%v)", nc, err)
	}
}

// Every guest's browser is agent-vm open-url: the names programs try, and
// $BROWSER for login and agent sessions.
func TestGuestBrowserIsTheURLOpener(t *testing.T) {
	c := goldenCases(t)["custom-ids-with-origins"]
	seed, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	shims, browser := 0, 0
	for _, f := range parseUserData(t, seed.UserData).WriteFiles {
		switch f.Path {
		case "/usr/local/bin/xdg-open", "/usr/local/bin/sensible-browser", "/usr/local/bin/x-www-browser", "/usr/local/bin/www-browser":
			shims++
			if f.Permissions != "0755" || f.Owner != "root:root" || !strings.Contains(f.Content, "\nexec /usr/local/bin/agent-vm open-url \"$@\"\n") {
				t.Errorf("%s is %s %s:\n%s", f.Path, f.Owner, f.Permissions, f.Content)
			}
		case "/etc/environment":
			if f.Append && strings.Contains(f.Content, "BROWSER=/usr/local/bin/xdg-open\n") {
				browser++
			}
		}
	}
	if shims != 4 || browser != 1 {
		t.Errorf("%d shims and %d BROWSER lines, want 4 and 1", shims, browser)
	}
}

func TestDefaults(t *testing.T) {
	seed, err := Render(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	ud := parseUserData(t, seed.UserData)
	for _, f := range ud.WriteFiles {
		switch f.Path {
		case "/etc/agent-vm/agent-mcp.env":
			if !strings.Contains(f.Content, "AGENT_MCP_PORT=8000\n") || !strings.Contains(f.Content, `AGENT_MCP_ALLOW_ORIGINS=""`) {
				t.Errorf("default env:\n%s", f.Content)
			}
		case "/etc/agent-vm/mcp.json":
			b, _ := base64.StdEncoding.DecodeString(f.Content)
			var v struct{ MCPServers map[string]any }
			if err := json.Unmarshal(b, &v); err != nil || v.MCPServers == nil || len(v.MCPServers) != 0 {
				t.Errorf("default mcp.json %q: want an empty mcpServers object (%v)", b, err)
			}
		}
	}
	if !bytes.Contains(seed.NetworkConfig, []byte(`"macaddress": "52:54:00:12:34:56"`)) {
		t.Errorf("network-config does not match QEMU's default MAC:\n%s", seed.NetworkConfig)
	}
}

func TestRenderIsPrintableASCIIAndDeterministic(t *testing.T) {
	for name, c := range goldenCases(t) {
		a, err := Render(c)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := Render(c)
		for doc, pair := range map[string][2][]byte{
			"user-data": {a.UserData, b.UserData}, "meta-data": {a.MetaData, b.MetaData}, "network-config": {a.NetworkConfig, b.NetworkConfig},
		} {
			if !bytes.Equal(pair[0], pair[1]) {
				t.Errorf("%s/%s: two renderings differ", name, doc)
			}
			for i, ch := range pair[0] {
				if (ch < 0x20 || ch > 0x7e) && ch != '\n' {
					t.Errorf("%s/%s: byte %#x at %d is not printable ASCII", name, doc, ch, i)
					break
				}
			}
		}
	}
}

func TestMetaDataInstanceIDIsWhatTheGuestScriptParses(t *testing.T) {
	// guest/setup reads the instance-id with sed from a line of its own.
	seed, err := Render(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(seed.MetaData), "\n  \"instance-id\": \"feat-x-1\",\n") {
		t.Errorf("meta-data layout changed; guest/setup's sed expects an \"instance-id\" line:\n%s", seed.MetaData)
	}
}
