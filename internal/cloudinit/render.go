package cloudinit

import (
	"bytes"
	"embed"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/modules"
)

// guestFS holds the units and scripts the seed installs. They are static: the
// Config reaches them only through /etc/agent-vm/agent-mcp.env and the
// arguments below.
//
//go:embed guest
var guestFS embed.FS

// Paths in the guest.
const (
	homeDir               = "/home/" + UserName
	libDir                = "/usr/local/lib/agent-vm"
	unitDir               = "/etc/systemd/system"
	etcDir                = "/etc/agent-vm"
	sshdDropIn            = "/etc/ssh/sshd_config.d/50-agent-vm.conf"
	cloudInitDisabledFile = "/etc/cloud/cloud-init.disabled"
	setupUnit             = "agent-vm-setup.service"
	workspaceUnit         = "agent-vm-workspace.service"
	mcpUnit               = "agent-mcp.service"
)

// Seed is the rendered NoCloud seed.
type Seed struct {
	UserData      []byte // "#cloud-config" + JSON; holds the host private key
	MetaData      []byte // JSON: instance-id, local-hostname
	NetworkConfig []byte // JSON: network config version 2
}

// Render validates c and renders the three NoCloud documents. The output
// depends only on c.
func Render(c Config) (Seed, error) {
	if err := c.Validate(); err != nil {
		return Seed{}, err
	}
	ud, err := renderUserData(c)
	if err != nil {
		return Seed{}, err
	}
	md, err := marshal(metaData{InstanceID: c.InstanceID, LocalHostname: c.Hostname})
	if err != nil {
		return Seed{}, err
	}
	nc, err := marshal(networkConfig{Version: 2, Ethernets: map[string]ethernet{
		"nic0": {Match: match{MACAddress: c.macAddress()}, DHCP4: true},
	}})
	if err != nil {
		return Seed{}, err
	}
	return Seed{UserData: append([]byte("#cloud-config\n"), ud...), MetaData: md, NetworkConfig: nc}, nil
}

type metaData struct {
	InstanceID    string `json:"instance-id"`
	LocalHostname string `json:"local-hostname"`
}

type networkConfig struct {
	Version   int                 `json:"version"`
	Ethernets map[string]ethernet `json:"ethernets"`
}

// ethernet matches the NIC by MAC: cloud-init's networkd and ENI renderers
// turn that into the NIC's real name, which a driver or name match does not.
type ethernet struct {
	Match match `json:"match"`
	DHCP4 bool  `json:"dhcp4"`
}

type match struct {
	MACAddress string `json:"macaddress"`
}

// userData is the cloud-config, in the order cloud-init applies it.
type userData struct {
	Hostname         string `json:"hostname"`
	PreserveHostname bool   `json:"preserve_hostname"`
	ManageEtcHosts   bool   `json:"manage_etc_hosts"`
	// Debian's cloud images carry no en_US.UTF-8, and cloud-init's default
	// locale then fails its config stage; C.UTF-8 is always there.
	Locale      string      `json:"locale"`
	Bootcmd     [][]string  `json:"bootcmd"`
	WriteFiles  []writeFile `json:"write_files"`
	Users       []user      `json:"users"`
	DisableRoot bool        `json:"disable_root"`
	// No ssh_pwauth: cloud-init's set-passwords module acts on it in the
	// config stage by rewriting sshd_config and restarting sshd, which cut
	// agent-vm's first SSH sessions after a boot. The sshd_config.d drop-in
	// (written before sshd starts) makes sshd key-only instead.
	SSHDeleteKeys bool `json:"ssh_deletekeys"`
	// The schema rejects an empty list; a key given in ssh_keys is kept, so
	// nothing is generated.
	SSHGenKeyTypes []string   `json:"ssh_genkeytypes"`
	SSHKeys        sshKeys    `json:"ssh_keys"`
	Runcmd         [][]string `json:"runcmd"`
}

type user struct {
	Name              string   `json:"name"`
	UID               int      `json:"uid"`
	PrimaryGroup      string   `json:"primary_group"`
	Groups            []string `json:"groups"`
	Shell             string   `json:"shell"`
	Sudo              string   `json:"sudo"`
	LockPasswd        bool     `json:"lock_passwd"`
	SSHAuthorizedKeys []string `json:"ssh_authorized_keys"`
}

type sshKeys struct {
	Ed25519Private string `json:"ed25519_private"`
	Ed25519Public  string `json:"ed25519_public"`
}

type writeFile struct {
	Path        string `json:"path"`
	Owner       string `json:"owner"`
	Permissions string `json:"permissions"`
	Encoding    string `json:"encoding,omitempty"`
	Content     string `json:"content"`
	// Append adds Content to the file rather than replacing it.
	Append bool `json:"append,omitempty"`
	// Defer writes the file in the final stage, once dev exists.
	Defer bool `json:"defer,omitempty"`
}

func renderUserData(c Config) ([]byte, error) {
	files, err := guestFiles(c)
	if err != nil {
		return nil, err
	}
	caCerts, err := caCertsCommand(c.CACerts)
	if err != nil {
		return nil, err
	}
	units := []string{setupUnit, workspaceUnit, mcpUnit}
	ud := userData{
		Hostname:         c.Hostname,
		PreserveHostname: false,
		ManageEtcHosts:   true,
		Locale:           "C.UTF-8",
		Bootcmd: slices.Concat([][]string{
			// users-groups cannot give a group a gid: create dev's group
			// first (sharing the gid if the image already uses it), then
			// name it as the user's primary group.
			{"sh", "-c", `getent group ` + UserName + ` >/dev/null || groupadd --gid "$1" --non-unique ` + UserName, "agent-vm-group", strconv.Itoa(c.GID)},
			// Start the agent-vm units as soon as this stage (which writes
			// them and creates dev) is done, rather than in runcmd at the
			// very end of the first boot.
			{"systemd-run", "--no-block", "--collect", "--unit=agent-vm-enable",
				"--property=After=cloud-init.service", "--description=agent-vm: enable and start the agent-vm units",
				"/bin/sh", "-c", "systemctl enable " + strings.Join(units, " ") + " && systemctl start --no-block " + mcpUnit},
		}, caCerts),
		// cloud-init's /etc/profile.d/Z99-cloud-locale-test.sh runs
		// `locale` in every login shell (the agent's among them) to warn
		// of a locale missing from the image, unless this file exists:
		// the locale is C.UTF-8, which every Debian has, and under TCG
		// the check is a tenth of a second of each login.
		WriteFiles: append(append(files, guidanceFiles(c)...),
			writeFile{Path: homeDir + "/.cloud-locale-test.skip", Owner: UserName + ":" + UserName, Permissions: "0644", Defer: true}),
		Users: []user{{
			Name:              UserName,
			UID:               c.UID,
			PrimaryGroup:      UserName,
			Groups:            []string{"systemd-journal"},
			Shell:             "/bin/bash",
			Sudo:              "ALL=(ALL) NOPASSWD:ALL",
			LockPasswd:        true,
			SSHAuthorizedKeys: c.AuthorizedKeys,
		}},
		DisableRoot:    true,
		SSHDeleteKeys:  true,
		SSHGenKeyTypes: []string{"ed25519"},
		SSHKeys:        sshKeys{Ed25519Private: c.HostKey.Private, Ed25519Public: c.HostKey.Public},
		Runcmd: slices.Concat([][]string{
			append([]string{libDir + "/ensure-packages"}, AgentPackages()...),
		}, vmRuncmd(c), [][]string{
			// Idempotent; covers a bootcmd that could not start them.
			append([]string{"systemctl", "enable", "--now", "--no-block"}, units...),
			// Later boots skip cloud-init (~20 s under TCG); see the package
			// documentation for provisioning again.
			{"touch", cloudInitDisabledFile},
		}),
	}
	if c.Template {
		ud.WriteFiles = files
	}
	return marshal(ud)
}

// vmRuncmd are the first boot's commands that belong to one VM (for a
// template, whose clones run them as FirstRun, only its agent CLIs and
// packages, which its clones share: ensure-packages then finds them
// installed): the agent CLI, the guidance notes' owner, and the
// repository's packages and .agent-vm/provision.sh, once per disk (how it
// ended is in guest.ProvisionStatus).
func vmRuncmd(c Config) [][]string {
	if c.Template {
		cmds := npmInstall(c)
		if len(c.ExtraPackages) > 0 {
			cmds = append(cmds, withProxy(append([]string{libDir + "/ensure-packages"}, c.ExtraPackages...)))
		}
		return cmds
	}
	return slices.Concat(npmInstall(c), guidanceOwner(c), [][]string{provisionCommand(c)})
}

// guestFiles lists the files the first boot writes.
func guestFiles(c Config) ([]writeFile, error) {
	files, err := staticFiles([]static{
		{"50-agent-vm.conf", sshdDropIn, "0644"},
		{"setup", libDir + "/setup", "0755"},
		{"mount-workspace", libDir + "/mount-workspace", "0755"},
		{"agent-mcp-start", libDir + "/agent-mcp-start", "0755"},
		{"ensure-packages", libDir + "/ensure-packages", "0755"},
		{setupUnit, unitDir + "/" + setupUnit, "0644"},
		{workspaceUnit, unitDir + "/" + workspaceUnit, "0644"},
		{mcpUnit, unitDir + "/" + mcpUnit, "0644"},
	})
	if err != nil {
		return nil, err
	}
	// The browser a program in the guest starts asks the host to open
	// the URL (internal/bridge): each name a program tries, and $BROWSER,
	// which xdg-open and sensible-browser try first. /usr/local/bin
	// comes before /usr/bin on PATH.
	shims, err := staticFiles([]static{
		{"open-url", "/usr/local/bin/xdg-open", "0755"},
		{"open-url", "/usr/local/bin/sensible-browser", "0755"},
		{"open-url", "/usr/local/bin/x-www-browser", "0755"},
		{"open-url", "/usr/local/bin/www-browser", "0755"},
	})
	if err != nil {
		return nil, err
	}
	browserEnv, err := guestFS.ReadFile("guest/browser.environment")
	if err != nil {
		return nil, fmt.Errorf("internal error: embedded guest file: %w", err)
	}
	// Appended: login sessions (pam_env) get it, agent sessions too.
	files = append(append(files, shims...), writeFile{Path: "/etc/environment", Owner: "root:root", Permissions: "0644", Content: string(browserEnv), Append: true})
	// The guest reaches the network only through its egress proxy: every
	// tool is told where it is.
	proxy, err := staticFiles([]static{
		{"apt-proxy.conf", "/etc/apt/apt.conf.d/80agent-vm-proxy", "0644"},
		{"npmrc", "/etc/npmrc", "0644"},
		{"gitconfig", "/etc/gitconfig", "0644"},
		{"pip.conf", "/etc/pip.conf", "0644"},
		{"system-proxy.conf", "/etc/systemd/system.conf.d/50-agent-vm-proxy.conf", "0644"},
	})
	if err != nil {
		return nil, err
	}
	env, err := guestFS.ReadFile("guest/proxy.environment")
	if err != nil {
		return nil, fmt.Errorf("internal error: embedded guest file: %w", err)
	}
	// Appended: login sessions (pam_env) get the proxy.
	files = append(append(files, proxy...), writeFile{Path: "/etc/environment", Owner: "root:root", Permissions: "0644", Content: string(env), Append: true})
	files = append(files, writeFile{Path: libDir + "/provision", Owner: "root:root", Permissions: "0755", Content: string(modules.Provision())})
	mcpConfig := c.MCP.Config
	if mcpConfig == nil {
		mcpConfig = []byte(`{"mcpServers": {}}` + "\n")
	}
	files = append(files,
		writeFile{Path: etcDir + "/agent-mcp.env", Owner: "root:root", Permissions: "0644", Content: mcpEnv(c)},
		// Base64: the caller's JSON may hold any Unicode, which need not
		// survive YAML's rules for printable characters; and it may hold
		// secrets, so only root and dev (the proxy) read it.
		writeFile{Path: etcDir + "/mcp.json", Owner: "root:" + UserName, Permissions: "0640",
			Encoding: "b64", Content: base64.StdEncoding.EncodeToString(mcpConfig)},
	)
	return files, nil
}

// static is an embedded guest file, src under guest/, written to dst.
type static struct{ src, dst, mode string }

// staticFiles are embedded guest files (guest/NAME), root's, at their paths.
func staticFiles(list []static) ([]writeFile, error) {
	var files []writeFile
	for _, s := range list {
		b, err := guestFS.ReadFile("guest/" + s.src)
		if err != nil {
			return nil, fmt.Errorf("internal error: embedded guest file: %w", err)
		}
		files = append(files, writeFile{Path: s.dst, Owner: "root:root", Permissions: s.mode, Content: string(b)})
	}
	return files, nil
}

// mcpEnv renders agent-mcp's environment file. Its values are validated to
// characters that need no quoting beyond the double quotes.
func mcpEnv(c Config) string {
	return "# Written by agent-vm (cloud-init) for agent-mcp.service.\n" +
		"AGENT_MCP_PORT=" + strconv.Itoa(c.mcpPort()) + "\n" +
		`AGENT_MCP_ALLOW_ORIGINS="` + strings.Join(c.MCP.AllowOrigins, " ") + `"` + "\n"
}

// marshal renders v as indented JSON that is also plain YAML: printable ASCII
// only, no HTML escapes, a final newline.
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("rendering cloud-init: %w", err)
	}
	for i, c := range b.Bytes() {
		if (c < 0x20 || c > 0x7e) && c != '\n' {
			return nil, fmt.Errorf("internal error: rendered cloud-init has byte %#x at offset %d", c, i)
		}
	}
	return b.Bytes(), nil
}

// caCertsCommand is the bootcmd entry that makes the guest trust pems (none
// without any): guest/ca-certs, with each certificate's subject hash
// (subjectHash) and the certificate as arguments.
// bootcmd runs in the init stage, before anything goes online.
//
// Not cloud-init's ca_certs module: it runs update-ca-certificates, which
// starts processes for each of the ~140 bundled certificates to rebuild the
// bundle, 60-120 s of a first boot under TCG (measured: 63 s for "0 added").
// guest/ca-certs leaves what that script would (a .crt per certificate under
// /usr/local/share/ca-certificates, its .pem and hash links in
// /etc/ssl/certs, its PEM appended to ca-certificates.crt) in about a
// second, so a later update-ca-certificates (a package upgrade) rebuilds the
// same state. It is idempotent; a certificate replaced or no longer given
// makes it rebuild the bundle the slow way, to drop the old one.
func caCertsCommand(pems []string) ([][]string, error) {
	if len(pems) == 0 {
		return nil, nil
	}
	script, err := guestFS.ReadFile("guest/ca-certs")
	if err != nil {
		return nil, fmt.Errorf("internal error: embedded guest file: %w", err)
	}
	cmd := []string{"sh", "-c", string(script), "agent-vm-ca-certs"}
	for _, p := range pems {
		h, err := subjectHash(p)
		if err != nil {
			h = "-" // the guest's openssl names it
		}
		cmd = append(cmd, h, strings.TrimSpace(p))
	}
	return [][]string{cmd}, nil
}

// guidanceFiles are the guidance notes in dev's home, written once dev
// exists (deferred).
func guidanceFiles(c Config) []writeFile {
	if c.Guidance == "" {
		return nil
	}
	var out []writeFile
	for _, f := range guest.GuidanceFiles {
		out = append(out, writeFile{Path: homeDir + "/" + f, Owner: UserName + ":" + UserName, Permissions: "0644",
			Content: c.Guidance, Defer: true})
	}
	return out
}

// guidanceOwner gives dev the directories write_files made (as root) for
// the guidance notes, so the agents can keep their own files there.
func guidanceOwner(c Config) [][]string {
	if c.Guidance == "" {
		return nil
	}
	cmd := []string{"chown", UserName + ":" + UserName}
	for _, f := range guest.GuidanceFiles {
		if d := path.Dir(f); d != "." {
			cmd = append(cmd, homeDir+"/"+d)
		}
	}
	return [][]string{cmd}
}

// npmInstall installs the npm packages (agent CLIs) globally, once the
// Debian packages (nodejs, npm) are there.
func npmInstall(c Config) [][]string {
	var cmds [][]string
	if len(c.NPMPackages) > 0 {
		cmds = append(cmds, withProxy(guest.NPMInstall(c.NPMPackages...)))
	}
	if len(c.NPMPrograms) > 0 {
		cmds = append(cmds, withProxy(guest.NPMInstallPrograms(c.NPMPrograms...)))
	}
	return cmds
}

// provisionCommand runs the provisioning script (modules/provision.sh),
// which installs the extra packages first, through ensure-packages, so that
// a package apt cannot install fails the provisioning with apt's words in
// its log.
func provisionCommand(c Config) []string {
	cmd := withProxy([]string{libDir + "/provision"})
	if len(c.ExtraPackages) > 0 {
		cmd = append(append(cmd, libDir+"/ensure-packages"), c.ExtraPackages...)
	}
	return cmd
}

// withProxy runs cmd with the proxy in its environment: runcmd's commands
// run under cloud-init's service, which neither /etc/environment nor the
// systemd default (read at the next boot) reaches on the first boot.
func withProxy(cmd []string) []string {
	return append([]string{"env", "http_proxy=" + guest.ProxyURL, "https_proxy=" + guest.ProxyURL,
		"HTTP_PROXY=" + guest.ProxyURL, "HTTPS_PROXY=" + guest.ProxyURL, "no_proxy=" + guest.NoProxy, "NO_PROXY=" + guest.NoProxy}, cmd...)
}
