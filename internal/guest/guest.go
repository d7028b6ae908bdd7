// Package guest is the guest contract: what every agent-vm guest provides,
// whichever backend made it, and what the host side relies on. The
// cloud-init renderer (internal/cloudinit), the NixOS renderer
// (internal/nixos, whose modules/guest.nix spells the same values, checked
// by this package's test) and the orchestration (internal/vm) all read it
// here, so they cannot drift apart.
package guest

import (
	"fmt"
	"regexp"
	"strings"
)

const (
	// User is the guest's login user; it runs the agent and agent-mcp.
	User = "dev"
	// RootShell is the guest command that runs, as root, the shell script
	// it reads on its input: User has passwordless sudo.
	RootShell = "sudo -n sh -s"
	// Workspace is where the guest mounts the workspace.
	Workspace = "/workspace"
	// ShareTag is the virtiofs tag and the 9p mount tag of the workspace.
	ShareTag = "workspace"
	// SSHPort is the guest's sshd port (forwarded from a host port).
	SSHPort = 22
	// MCPPort is the port agent-mcp listens on in the guest.
	MCPPort = 8000
	// HealthPath answers GET without a token once agent-mcp is serving.
	HealthPath = "/health"
	// MCPTokenCredential is the systemd credential that carries agent-mcp's
	// bearer token into the guest (passed by QEMU as fw_cfg
	// opt/io.systemd.credentials/<name>).
	MCPTokenCredential = "agent-vm.mcp-token"
	// HostKeyCredential carries a NixOS guest's SSH host key (never in the
	// Nix store).
	HostKeyCredential = "agent-vm.ssh-host-key"
	// HostAddr is where the guest reaches the host: the ports a VM's record lists
	// as exposed (state.Record.Exposed), each leading to the same port on the
	// host's 127.0.0.1, and the egress proxy at ProxyPort. Nothing else of the
	// host answers there, nor at the gateway 10.0.2.2 (slirp's restrict=on;
	// libslirp refuses guestfwd rules at the gateway's address).
	HostAddr = "10.0.2.100"
	// ProxyPort is the egress proxy's port at HostAddr: the guest's only
	// way to the network (HTTP, and HTTPS through CONNECT).
	ProxyPort = 3128
	// ProxyURL is the proxy as the guest's programs are configured with it.
	ProxyURL = "http://10.0.2.100:3128"
	// NoProxy are the destinations the guest reaches without the proxy:
	// itself, and the proxy and exposed ports at HostAddr.
	NoProxy = "localhost,127.0.0.1,::1,10.0.2.100"
	// ClaudeConfig is Claude Code's configuration file (its user and local
	// MCP scopes among it), relative to User's home.
	ClaudeConfig = ".claude.json"
)

// The browser bridges: what the guest reaches of the host's browser when
// the user opens them (agent-vm browser), each a forward the VM's held
// SSH connection asks the guest's sshd for, so the guest listens and the
// host answers. None exists until asked for.
const (
	// ChromeBridgeDir is where the guest's Claude Code looks for Claude in
	// Chrome's bridge socket (/tmp/claude-mcp-browser-bridge-<user>/*.sock).
	ChromeBridgeDir = "/tmp/claude-mcp-browser-bridge-" + User
	// ChromeBridgeSocket is the guest's end of the tunnelled bridge.
	ChromeBridgeSocket = ChromeBridgeDir + "/agent-vm.sock"
	// DevToolsPort is where the guest reaches a host browser's DevTools
	// endpoint: 127.0.0.1 of the guest.
	DevToolsPort = 9222
	// OpenURLDir holds OpenURLSocket (the user's own, 0700).
	OpenURLDir = "/tmp/agent-vm-" + User
	// OpenURLSocket is the URL opener: the guest's xdg-open asks the host to
	// open a URL there.
	OpenURLSocket = OpenURLDir + "/open-url.sock"
)

// The repository's own provisioning (both backends): the files in the
// workspace, and where the guest keeps the run's log and outcome. The
// script is read from the workspace when it runs, at the first boot of a
// root disk (create, reset), as root; it runs once per root disk.
const (
	// ConfigFile holds the repository's packages and create defaults
	// (internal/repoconfig), relative to Workspace.
	ConfigFile = ".agent-vm/config.toml"
	// ProvisionScript is the repository's provisioning script, relative to
	// Workspace.
	ProvisionScript = ".agent-vm/provision.sh"
	// ProvisionLog is the guest's log of the run: package installs and the
	// script's output.
	ProvisionLog = "/var/log/agent-vm-provision.log"
	// ProvisionStatus records how the run ended, as lines key=value:
	// status (ok, failed or skipped), exit (the exit status) and boot (the
	// boot id of the boot that ran it). It is also the stamp that keeps the
	// run to once per root disk.
	ProvisionStatus = "/var/lib/agent-vm/provision.status"
)

// FirstBootLog is where the Debian guest's cloud-init writes what its
// stages and the first boot's commands print (the packages, the agent
// CLIs' npm install): what start shows while it waits for the first boot's
// setup, and the tail a failed template build ends with.
const FirstBootLog = "/var/log/cloud-init-output.log"

// GuidanceFiles are where agents look for the user's own instructions,
// relative to User's home: Claude Code, Codex, Gemini CLI, and a plain
// AGENTS.md. Each gets the same text (Guidance).
var GuidanceFiles = []string{".claude/CLAUDE.md", ".codex/AGENTS.md", ".gemini/GEMINI.md", "AGENTS.md"}

// GuidanceInfo is what the guidance says about one VM.
type GuidanceInfo struct {
	Branch string
	Repo   string // where the repository lives on the host
	// Install says how to install software in this guest (the backend's
	// words: apt-get for Debian, nix-shell for NixOS).
	Install string
}

// Guidance is the short note that tells an agent where it is.
func Guidance(g GuidanceInfo) string {
	return fmt.Sprintf(`# You are working in an agent-vm virtual machine

This machine is a disposable VM that agent-vm made for the branch %[1]s of
the repository at %[2]s on the user's host. You may change anything in it:
the host is protected from what happens here.

- %[3]s is the repository, checked out at %[1]s. It is shared with the
  host: what you write there, the user sees at once. Everything outside
  %[3]s is lost when the VM is destroyed.
- You are the user %[4]s, with passwordless sudo. %[5]s
- The host reaches this VM on forwarded ports only: SSH, agent-mcp (guest
  port %[6]d) and those the user forwards; `+"`agent-vm status`"+` on the host
  shows their host ports. For the user to reach a server you start here
  (listening on 0.0.0.0, not 127.0.0.1), ask them to run
  `+"`agent-vm port add --vm %[7]s PORT`"+`: it then answers on 127.0.0.1 on
  the host, on PORT or the port that command prints.
- The network is reached only through agent-vm's proxy (already set:
  http_proxy, https_proxy, apt, npm, git, pip), which allows the agents'
  APIs, package registries and the repository's git host. A refused
  connection answers 403 with the command the user can run to allow it:
  ask them. The host's own services are unreachable, except ports the
  user exposed to this VM, at %[8]s.
- Commit your work in %[3]s with git. Pushing, and what goes upstream,
  is the user's decision: do not push unless they ask you to.
`, "`"+g.Branch+"`", g.Repo, Workspace, User, g.Install, MCPPort, g.Branch, HostAddr)
}

// Agent is a coding-agent CLI a VM can have installed (create --agent).
type Agent struct {
	Name    string // what the user types: claude, codex, gemini
	Package string // its npm package, installed globally on the first boot
	// Version is the package's version agent-vm installs: pinned, so that
	// every VM and template runs the agent it was tested with, and a
	// template can tell whether it holds the current one. `template build
	// --agents NAME@VERSION` installs another.
	Version string
	// Node is the Node.js major version its pinned release needs at
	// least (its package.json's engines; 0: any the guest has).
	Node    int
	Command string // the program it installs
	// Native is the npm package with the agent's program for the guest
	// (Linux on glibc; {arch} is Node's name of its CPU, x64 or arm64),
	// when Package names one such package per platform as optional
	// dependencies and only copies the program over its own at install.
	// npm 9 (Debian 12's) installs the musl one too, even with
	// --omit=optional in a global install: for Claude Code 2.1 two 186 MB
	// downloads, two 384 MB extractions and a 244 MB copy, tens of minutes
	// under TCG. At an exact version Specs name Native alone, and
	// NPMInstallPrograms puts its program (named Command, at the package's
	// top) on PATH.
	Native string
	// Keys are the variables it reads its credential from: an API key,
	// and for claude the long-lived token `claude setup-token` prints
	// (CLAUDE_CODE_OAUTH_TOKEN, for a subscription).
	Keys []string
}

// Agents are the agent CLIs agent-vm knows, by name.
var Agents = []Agent{
	{Name: "claude", Package: "@anthropic-ai/claude-code", Native: "@anthropic-ai/claude-code-linux-{arch}", Version: "2.1.332", Command: "claude", Keys: []string{"ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN"}},
	{Name: "codex", Package: "@openai/codex", Version: "0.171.0", Command: "codex", Keys: []string{"OPENAI_API_KEY"}},
	{Name: "gemini", Package: "@google/gemini-cli", Version: "0.61.0", Node: 20, Command: "gemini", Keys: []string{"GEMINI_API_KEY"}},
}

// DebianNode is the Node.js major version of the Debian 12 guest (the
// qemu and vagrant backends' image: Debian's nodejs package). Claude
// Code's package asks for Node.js 22 but runs its own native binary;
// Codex runs on it; Gemini CLI, since 0.4, does not (its code uses
// regular expression syntax Node.js 18 lacks).
const DebianNode = 18

// RunsOnDebian reports whether the agent's pinned release runs on the
// Debian 12 guest's Node.js.
func (a Agent) RunsOnDebian() bool { return a.Node <= DebianNode }

// Spec is the npm package spec that installs the agent at version (its
// pinned Version when "").
func (a Agent) Spec(version string) string {
	if version == "" {
		version = a.Version
	}
	return a.Package + "@" + version
}

// Specs are the npm package specs that install the agent at version ("":
// its pinned Version) on a guest whose CPU is goarch's, and whether they
// are its program's package, to be installed by NPMInstallPrograms: at an
// exact version, its Native package at that version alone. A dist-tag,
// or a CPU Node has no name for here, installs Package as npm chooses.
func (a Agent) Specs(version, goarch string) (specs []string, program bool) {
	if version == "" {
		version = a.Version
	}
	native, ok := a.nativePackage(version, goarch)
	if !ok {
		return []string{a.Spec(version)}, false
	}
	return []string{native + "@" + version}, true
}

// Installed is the npm package whose package.json says which version of
// the agent Specs installed.
func (a Agent) Installed(version, goarch string) string {
	if native, ok := a.nativePackage(version, goarch); ok {
		return native
	}
	return a.Package
}

// nativePackage is the agent's Native package for goarch, when an
// install at version takes it alone.
func (a Agent) nativePackage(version, goarch string) (string, bool) {
	if version == "" {
		version = a.Version
	}
	arch, known := map[string]string{"amd64": "x64", "arm64": "arm64"}[goarch]
	if a.Native == "" || !known || !IsExactVersion(version) {
		return "", false
	}
	return strings.ReplaceAll(a.Native, "{arch}", arch), true
}

// releasePattern is a version as a package.json states it.
const releasePattern = `[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?`

var exactVersionRE = regexp.MustCompile(`^` + releasePattern + `$`)

// IsExactVersion says whether v is one release (1.2.3, 1.2.3-beta.1), not
// a dist-tag such as latest.
func IsExactVersion(v string) bool { return exactVersionRE.MatchString(v) }

// AgentPin is an agent CLI at a version, as a template holds it.
type AgentPin struct {
	Agent
	// At is the version asked for: the pinned Version, another release, or
	// an npm dist-tag such as latest.
	At string
}

// String is NAME@VERSION.
func (p AgentPin) String() string { return p.Name + "@" + p.At }

// npmVersionRE is what --agents accepts after NAME@: a release
// (1.2.3, 1.2.3-beta.1) or a dist-tag (latest, next); never a range, a
// URL or a path, so the spec npm gets is exactly one version.
var npmVersionRE = regexp.MustCompile(`^(` + releasePattern + `|[a-z][a-z0-9-]{0,31})$`)

// ParseAgentPins reads a list of agents (template build --agents, for the
// Debian guest): comma-separated names, each optionally NAME@VERSION;
// "all" is every known agent that runs on the Debian guest, and "none"
// none. Each is at its pinned version unless one is given; one that
// cannot run on the Debian guest is refused.
func ParseAgentPins(list string) ([]AgentPin, error) {
	list = strings.TrimSpace(list)
	switch list {
	case "none":
		return nil, nil
	case "", "all":
		var pins []AgentPin
		for _, a := range Agents {
			if a.RunsOnDebian() {
				pins = append(pins, AgentPin{Agent: a, At: a.Version})
			}
		}
		return pins, nil
	}
	var pins []AgentPin
	seen := map[string]bool{}
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		name, version, versioned := strings.Cut(item, "@")
		a, err := LookupAgent(name)
		if err != nil {
			return nil, fmt.Errorf("--agents %q: %q is not an agent agent-vm knows (hint: use some of %s, each optionally NAME@VERSION; all, or none)", list, name, strings.Join(AgentNames(), ","))
		}
		if seen[name] {
			return nil, fmt.Errorf("--agents %q names %s twice (hint: give each agent once, e.g. --agents claude,codex)", list, name)
		}
		seen[name] = true
		if !a.RunsOnDebian() {
			return nil, fmt.Errorf("--agents %q: %s %s needs Node.js %d or newer, and the Debian 12 guest has Node.js %d (Debian's package), so it would not run there (hint: leave %s out; all is the agents that run there)", list, name, a.Version, a.Node, DebianNode, name)
		}
		switch {
		case !versioned:
			version = a.Version
		case !npmVersionRE.MatchString(version):
			return nil, fmt.Errorf("--agents: %q is not a version of %s (hint: a release such as %s, or latest)", version, name, a.Version)
		}
		pins = append(pins, AgentPin{Agent: a, At: version})
	}
	return pins, nil
}

// NPMInstall is the command (run as root) that installs npm packages
// globally in a guest: agent CLIs at first boot, or on first use by run
// (NPMInstallScript).
func NPMInstall(packages ...string) []string {
	return append([]string{"sh", "-c", "set -e\n" + NPMInstallScript(""), "sh"}, packages...)
}

// NPMCommand is npm's own command that installs npm packages globally,
// under prefix ("": npm's configured one).
func NPMCommand(prefix string, packages ...string) []string {
	cmd := []string{"npm", "install", "--global"}
	if prefix != "" {
		cmd = append(cmd, "--prefix", prefix)
	}
	return append(append(cmd, "--no-fund", "--no-audit", "--no-update-notifier", "--"), packages...)
}

// NPMInstallScript is shell (run as root, the packages as its arguments)
// that installs npm packages globally, under prefix ("": npm's configured
// one; written unquoted, so a plain path): with the guest's agent-vm
// (`agent-vm __npm-install`, which unpacks without npm the packages that
// need nothing else, minutes faster under TCG, and has npm install the
// others), or with npm where the guest's agent-vm lacks that command (a
// VM started before an upgrade of agent-vm).
func NPMInstallScript(prefix string) string {
	at := ""
	if prefix != "" {
		at = " --prefix " + prefix
	}
	return "if agent-vm __npm-install --help >/dev/null 2>&1; then\n" +
		"\tagent-vm __npm-install" + at + " -- \"$@\"\n" +
		"else\n\t" + strings.Join(NPMCommand(prefix, `"$@"`), " ") + "\nfi\n"
}

// NPMGlobalRoot is where Debian's npm installs global packages (its
// prefix is /usr/local), and NPMGlobalBin where it links their programs.
const (
	NPMGlobalRoot = "/usr/local/lib/node_modules"
	NPMGlobalBin  = "/usr/local/bin"
)

// NPMInstallPrograms is the command (run as root) that installs agents'
// program packages (Agent.Specs with program true) globally and links
// each one's program into NPMGlobalBin as its agent's command: such a
// package has no "bin" of its own (its agent's Package copied it over a
// stub at install).
func NPMInstallPrograms(specs ...string) []string {
	script := "set -e\n" + NPMInstallScript("")
	for _, spec := range specs {
		if a, pkg, ok := programOf(spec); ok {
			script += fmt.Sprintf("ln -sfn '%s/%s/%s' '%s/%s'\n", NPMGlobalRoot, pkg, a.Command, NPMGlobalBin, a.Command)
		}
	}
	return append([]string{"sh", "-c", script, "sh"}, specs...)
}

// programOf is the agent whose program package spec (NAME@VERSION)
// installs, and that package's name.
func programOf(spec string) (Agent, string, bool) {
	i := strings.LastIndex(spec, "@")
	if i <= 0 {
		return Agent{}, "", false
	}
	pkg := spec[:i]
	for _, a := range Agents {
		for _, arch := range []string{"amd64", "arm64"} {
			if native, ok := a.nativePackage(spec[i+1:], arch); ok && native == pkg {
				return a, pkg, true
			}
		}
	}
	return Agent{}, "", false
}

// LookupAgent finds a known agent by name.
func LookupAgent(name string) (Agent, error) {
	for _, a := range Agents {
		if a.Name == name {
			return a, nil
		}
	}
	return Agent{}, fmt.Errorf("--agent %q is not an agent agent-vm knows (hint: use one of %s; any other tool you can install in the VM yourself)", name, strings.Join(AgentNames(), ", "))
}

func AgentNames() []string {
	var names []string
	for _, a := range Agents {
		names = append(names, a.Name)
	}
	return names
}
