package guest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The NixOS guest module spells the contract in Nix; it must say what this
// package says.
func TestGuestModuleAgrees(t *testing.T) {
	raw, err := os.ReadFile("../../modules/guest.nix")
	if err != nil {
		t.Fatal(err)
	}
	nix := string(raw)
	for _, want := range []string{
		fmt.Sprintf("userName = %q;", User),
		fmt.Sprintf("hostKeyCredential = %q;", HostKeyCredential),
		fmt.Sprintf("tokenCredential = %q;", MCPTokenCredential),
		fmt.Sprintf("device = %q;", ShareTag),
		fmt.Sprintf("tag = %q;", ShareTag),
		fmt.Sprintf("default = %q;", Workspace),
		fmt.Sprintf("port = lib.mkDefault %d;", MCPPort),
		fmt.Sprintf("default = lib.mkDefault %q;", ProxyURL),
		fmt.Sprintf("noProxy = lib.mkDefault %q;", NoProxy),
	} {
		if !strings.Contains(nix, want) {
			t.Errorf("modules/guest.nix lacks %s", want)
		}
	}
	for _, f := range GuidanceFiles {
		if !strings.Contains(nix, fmt.Sprintf("%q", f)) {
			t.Errorf("modules/guest.nix does not link the guidance note to %s", f)
		}
	}
}

func TestGuidanceSaysWhereTheAgentIs(t *testing.T) {
	g := Guidance(GuidanceInfo{Branch: "feature/x", Repo: "/home/me/project",
		Install: "Install packages with `sudo apt-get install NAME`."})
	for _, want := range []string{"`feature/x`", "/home/me/project", "/workspace", "user dev, with passwordless sudo",
		"sudo apt-get install NAME", "agent-mcp (guest\n  port 8000)", "`agent-vm status` on the host\n  shows their host ports", "`agent-vm port add --vm feature/x PORT`", "0.0.0.0", "do not push unless they ask",
		"only through agent-vm's proxy", "ports the\n  user exposed to this VM, at 10.0.2.100"} {
		if !strings.Contains(g, want) {
			t.Errorf("guidance lacks %q:\n%s", want, g)
		}
	}
}

// Both guests run modules/provision.sh, and guest.nix guards its unit with
// the status file: they must use the contract's paths.
func TestProvisionFilesAgree(t *testing.T) {
	script, err := os.ReadFile("../../modules/provision.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"workspace=" + Workspace + "\n", "script=$workspace/" + ProvisionScript + "\n",
		"log=" + ProvisionLog + "\n", "status=" + ProvisionStatus + "\n"} {
		if !strings.Contains(string(script), want) {
			t.Errorf("modules/provision.sh lacks %q", want)
		}
	}
	nix, err := os.ReadFile("../../modules/guest.nix")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf(`ConditionPathExists = "!%s";`, ProvisionStatus); !strings.Contains(string(nix), want) {
		t.Errorf("modules/guest.nix lacks %s", want)
	}
}

func TestParseAgentPins(t *testing.T) {
	for _, c := range []struct {
		in, want, err string
	}{
		{"", "claude@2.1.332 codex@0.171.0", ""},
		{"all", "claude@2.1.332 codex@0.171.0", ""},
		{"none", "", ""},
		{"claude", "claude@2.1.332", ""},
		{" claude , codex@0.172.1 ", "claude@2.1.332 codex@0.172.1", ""},
		{"codex@latest", "codex@latest", ""},
		{"gemini", "", "gemini 0.61.0 needs Node.js 20 or newer, and the Debian 12 guest has Node.js 18"},
		{"claude@2.2.0-beta.1", "claude@2.2.0-beta.1", ""},
		{"clippy", "", `"clippy" is not an agent agent-vm knows`},
		{"claude,", "", `"" is not an agent`},
		{"claude,claude@1.0.0", "", "names claude twice"},
		{"claude@^2.1", "", `"^2.1" is not a version of claude`},
		{"claude@https://evil.example/x.tgz", "", "is not a version of claude"},
		{"claude@../x", "", "is not a version of claude"},
		{"claude@", "", `"" is not a version of claude`},
	} {
		pins, err := ParseAgentPins(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseAgentPins(%q): got %v, want an error with %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseAgentPins(%q): %v", c.in, err)
			continue
		}
		var got []string
		for _, p := range pins {
			got = append(got, p.String())
		}
		if strings.Join(got, " ") != c.want {
			t.Errorf("ParseAgentPins(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// Every agent is pinned to an exact release, which npm installs as
// exactly that (Spec).
func TestAgentsArePinned(t *testing.T) {
	for _, a := range Agents {
		if !npmVersionRE.MatchString(a.Version) || !strings.Contains(a.Version, ".") {
			t.Errorf("%s is pinned to %q, not a release", a.Name, a.Version)
		}
		if got, want := a.Spec(""), a.Package+"@"+a.Version; got != want {
			t.Errorf("%s: Spec = %q, want %q", a.Name, got, want)
		}
	}
}

// Claude Code at an exact version is its program's package alone (npm 9
// would add the musl program and copy the program over a stub); at a
// dist-tag npm chooses.
func TestSpecsTakeTheProgramPackageAlone(t *testing.T) {
	claude, err := LookupAgent("claude")
	if err != nil {
		t.Fatal(err)
	}
	if specs, program := claude.Specs("", "amd64"); !program || strings.Join(specs, " ") != "@anthropic-ai/claude-code-linux-x64@"+claude.Version {
		t.Errorf("pinned: %q %v", specs, program)
	}
	if specs, program := claude.Specs("2.1.300", "arm64"); !program || strings.Join(specs, " ") != "@anthropic-ai/claude-code-linux-arm64@2.1.300" {
		t.Errorf("another release on arm64: %q %v", specs, program)
	}
	for _, c := range []struct{ version, goarch string }{{"latest", "amd64"}, {"", "riscv64"}} {
		if specs, program := claude.Specs(c.version, c.goarch); program || strings.Join(specs, " ") != claude.Spec(c.version) {
			t.Errorf("%s on %s: %q %v, want the package as npm chooses", c.version, c.goarch, specs, program)
		}
		if got := claude.Installed(c.version, c.goarch); got != claude.Package {
			t.Errorf("%s on %s: installed package %q", c.version, c.goarch, got)
		}
	}
	if got := claude.Installed("", "amd64"); got != "@anthropic-ai/claude-code-linux-x64" {
		t.Errorf("pinned: installed package %q", got)
	}
	codex, _ := LookupAgent("codex")
	if specs, program := codex.Specs("", "amd64"); program || strings.Join(specs, " ") != codex.Spec("") {
		t.Errorf("codex: %q %v", specs, program)
	}
}

// NPMInstallPrograms' script, run with stand-ins (labelled: they record
// their arguments, at the exec boundary) for agent-vm, npm and ln: it
// installs the specs with the guest's agent-vm where it has
// __npm-install, else with npm, and links each program as its agent's
// command; a failed install links nothing.
func TestNPMInstallProgramsLinksTheCommand(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"npm", "ln"} {
		stub := "#!/bin/sh\necho " + name + " \"$@\" >>" + dir + "/calls\nexit ${FAIL_" + strings.ToUpper(name) + ":-0}\n"
		if err := os.WriteFile(dir+"/"+name, []byte(stub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// agent-vm: one that knows __npm-install (its --help answers), or an
	// older one (it does not).
	newer := "#!/bin/sh\n[ \"$2\" = --help ] && exit 0\necho agent-vm \"$@\" >>" + dir + "/calls\nexit ${FAIL_NPM:-0}\n"
	older := "#!/bin/sh\necho 'No help topic for '\"$1\" >&2\nexit 3\n"
	argv := NPMInstallPrograms("@anthropic-ai/claude-code-linux-x64@2.1.332")
	run := func(agentVM string, env ...string) (string, error) {
		os.Remove(dir + "/calls")
		if err := os.WriteFile(dir+"/agent-vm", []byte(agentVM), 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append([]string{"PATH=" + dir + ":/usr/bin:/bin"}, env...)
		err := cmd.Run()
		b, _ := os.ReadFile(dir + "/calls")
		return string(b), err
	}
	link := "ln -sfn /usr/local/lib/node_modules/@anthropic-ai/claude-code-linux-x64/claude /usr/local/bin/claude\n"
	for _, c := range []struct{ agentVM, install string }{
		{newer, "agent-vm __npm-install -- @anthropic-ai/claude-code-linux-x64@2.1.332\n"},
		{older, "npm install --global --no-fund --no-audit --no-update-notifier -- @anthropic-ai/claude-code-linux-x64@2.1.332\n"},
	} {
		calls, err := run(c.agentVM)
		if err != nil || calls != c.install+link {
			t.Errorf("the script ran %q (%v), want %q", calls, err, c.install+link)
		}
		calls, err = run(c.agentVM, "FAIL_NPM=1")
		if err == nil || strings.Contains(calls, "ln ") {
			t.Errorf("after a failed install: %v, ran %q; want a failure and no link", err, calls)
		}
	}
}
