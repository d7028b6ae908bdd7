package scenario

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/blackbox"
	"github.com/agent-vm/agent-vm/integration/harness"
)

func cliScenario() harness.Scenario {
	return harness.Scenario{
		Name:    "cli",
		Summary: "VM records without booting: create, list, status, ssh-config, destroy, bad input",
		Verbs:   []string{"create", "list", "status", "destroy", "ssh-config"},
		Run:     runCLI,
	}
}

// cliBranch is the branch the cli scenario's VM is made for.
const cliBranch = "itest/cli"

func runCLI(ctx context.Context, s *harness.S) {
	var rp *harness.Repo
	var st *blackbox.Status
	s.Step(ctx, "make a git repo with a bare remote", func() (err error) {
		rp, err = harness.NewRepo(ctx, s.Dir(), nil)
		return err
	})
	s.Step(ctx, "create a VM for a new branch", func() (err error) {
		if _, err := s.Create(ctx, rp.Dir, cliBranch); err != nil {
			return err
		}
		st, _, err = s.Status(ctx, cliBranch, harness.StatusKeys())
		return err
	})
	s.Step(ctx, "its workspace: a clone at the branch, origin and upstream", func() error {
		return checkWorkspace(ctx, s, st, rp, cliBranch)
	})
	s.Step(ctx, "list shows it (table and --json)", func() error { return checkList(ctx, s, st) })
	s.Step(ctx, "status of a stopped VM (text and --json)", func() error { return checkStoppedStatus(ctx, s, st) })
	s.Step(ctx, "ssh-config names its key and its pinned known_hosts", func() error { return checkSSHConfig(ctx, s, st) })
	s.Step(ctx, "a second create of the branch says it already exists", func() error {
		res := s.TryCreate(ctx, rp.Dir, cliBranch)
		if err := harness.Want(res, 1); err != nil {
			return err
		}
		if !strings.Contains(res.Stderr, "already exists") {
			return harness.Failf(res, "the error does not say the VM already exists")
		}
		return nil
	})
	s.Step(ctx, "destroy refuses to lose an unpushed commit", func() error { return checkDestroyRefuses(ctx, s, st) })
	s.Step(ctx, "its refusal shows a hostile file name escaped", func() error { return checkRefusalEscapes(ctx, s, st) })
	s.Step(ctx, "destroy --force removes the VM and its directory", func() error {
		if _, err := s.OK(ctx, "destroy", "--force", cliBranch); err != nil {
			return err
		}
		return checkGone(ctx, s, cliBranch, st.Paths.Dir)
	})
	s.Step(ctx, "hostile branch names work or fail cleanly", func() error { return checkHostileNames(ctx, s, rp) })
	s.Step(ctx, "a branch whose slug another VM has is refused", func() error { return checkSlugCollision(ctx, s, rp) })
	s.Step(ctx, "two repositories each have a main VM, kept apart", func() error { return checkTwoRepositories(ctx, s, rp) })
	s.Step(ctx, "an unknown VM is an error with a hint", func() error { return checkUnknownVM(ctx, s) })
	s.Step(ctx, "bad flags, arguments and commands are usage errors", func() error { return checkUsageErrors(ctx, s) })
	s.Step(ctx, "commands work as the usage lines and hints print them", func() error { return checkAsPrinted(ctx, s, rp) })
}

// checkWorkspace: the workspace is a git clone of the source at the
// branch, origin is the source repository and upstream the source's origin.
func checkWorkspace(ctx context.Context, s *harness.S, st *blackbox.Status, rp *harness.Repo, branch string) error {
	ws := st.Paths.Workspace
	if !harness.Within(s.StateDir(), st.Paths.Dir) || !harness.Within(st.Paths.Dir, ws) {
		return harness.Failf(nil, "the VM's directory %s and workspace %s should lie inside the state directory %s", st.Paths.Dir, ws, s.StateDir())
	}
	head, err := harness.Git(ctx, ws, "rev-parse", "--abbrev-ref", "HEAD")
	if err != nil {
		return err
	}
	if head != branch {
		return fmt.Errorf("the workspace %s has %q checked out, want %q", ws, head, branch)
	}
	got, _ := harness.Git(ctx, ws, "rev-parse", "HEAD")
	wantHead, _ := harness.Git(ctx, rp.Dir, "rev-parse", "main")
	if got != wantHead {
		return fmt.Errorf("the new branch starts at %s, want the source's HEAD %s", got, wantHead)
	}
	origin, err := harness.Git(ctx, ws, "remote", "get-url", "origin")
	if err != nil {
		return err
	}
	if !harness.SamePath(strings.TrimPrefix(origin, "file://"), rp.Dir) {
		return fmt.Errorf("the workspace's origin is %q, want the source repository %s", origin, rp.Dir)
	}
	upstream, err := harness.Git(ctx, ws, "remote", "get-url", "upstream")
	if err != nil {
		return fmt.Errorf("the workspace has no upstream remote (the source's own origin): %w", err)
	}
	if !harness.SamePath(strings.TrimPrefix(upstream, "file://"), rp.Remote) {
		return fmt.Errorf("the workspace's upstream is %q, want the source's origin %s", upstream, rp.Remote)
	}
	if !harness.SamePath(st.Git.Source, rp.Dir) {
		return harness.Failf(nil, "status says git.source %q, want %s", st.Git.Source, rp.Dir)
	}
	return nil
}

// checkList: the VM's row in the table and its object in --json agree with
// its status.
func checkList(ctx context.Context, s *harness.S, st *blackbox.Status) error {
	res, err := s.OK(ctx, "list")
	if err != nil {
		return err
	}
	header, rows, err := harness.ParseTable(res.Stdout)
	if err != nil {
		return harness.Failf(res, "%v", err)
	}
	wantHeader := []string{"BRANCH", "REPO", "NAME", "BACKEND", "STATE", "SSH", "MCP", "CREATED"}
	if len(header) < len(wantHeader) || strings.Join(header[:len(wantHeader)], " ") != strings.Join(wantHeader, " ") {
		return harness.Failf(res, "the table's columns are %q, want %q", header, wantHeader)
	}
	var row map[string]string
	for _, r := range rows {
		if r["BRANCH"] == st.Branch {
			row = r
		}
	}
	if row == nil {
		return harness.Failf(res, "the table has no row for %q", st.Branch)
	}
	for col, want := range map[string]string{"NAME": st.Slug, "BACKEND": st.Backend, "STATE": "stopped",
		"SSH": strconv.Itoa(st.Ports.SSH), "MCP": strconv.Itoa(st.Ports.MCP)} {
		if row[col] != want {
			return harness.Failf(res, "the %s column of %q says %q, want %q", col, st.Branch, row[col], want)
		}
	}

	res, err = s.OK(ctx, "list", "--json")
	if err != nil {
		return err
	}
	list, raw, err := harness.ParseList([]byte(res.Stdout))
	if err != nil {
		return harness.Failf(res, "%v", err)
	}
	for i, o := range list {
		if o.Branch != st.Branch {
			continue
		}
		if _, err := harness.ParseStatus(mustJSON(raw[i]), harness.StatusKeys()); err != nil {
			return harness.Failf(res, "its entry: %v", err)
		}
		if o.MCP.Token != "" {
			return harness.Failf(res, "list --json shows the MCP token; only status may")
		}
		if o.State != "stopped" || o.Ports != st.Ports || o.Slug != st.Slug {
			return harness.Failf(res, "its entry says state %q, ports %+v, slug %q; status says stopped, %+v, %q", o.State, o.Ports, o.Slug, st.Ports, st.Slug)
		}
		return nil
	}
	return harness.Failf(res, "list --json has no entry for %q", st.Branch)
}

func mustJSON(m map[string]json.RawMessage) []byte {
	b, _ := json.Marshal(m)
	return b
}

// checkStoppedStatus: the documented fields of a stopped VM hold sensible
// values, and the text form says the same.
func checkStoppedStatus(ctx context.Context, s *harness.S, st *blackbox.Status) error {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if st.State != "stopped" {
		bad("state is %q, want stopped", st.State)
	}
	if st.Agent.State != "unknown" {
		bad("agent.state is %q for a stopped VM, want unknown", st.Agent.State)
	}
	if st.Pid != 0 {
		bad("pid is %d for a stopped VM", st.Pid)
	}
	if st.Slug == "" || st.Backend == "" {
		bad("slug %q or backend %q is empty", st.Slug, st.Backend)
	}
	if p := st.Ports; p.SSH < 1024 || p.MCP < 1024 || p.SSH > 65535 || p.MCP > 65535 || p.SSH == p.MCP {
		bad("ports %+v: want two different unprivileged ports", p)
	}
	if r := st.Resources; r.CPUs < 1 || r.MemoryMiB < 256 || r.DiskGiB < 1 {
		bad("resources %+v look wrong", r)
	}
	if age := time.Since(st.CreatedAt); st.CreatedAt.IsZero() || age < -time.Minute || age > time.Hour {
		bad("created_at %s is not about now", st.CreatedAt)
	}
	if st.SSH.Host != "127.0.0.1" || st.SSH.Port != st.Ports.SSH || st.SSH.User == "" {
		bad("ssh is %s@%s:%d, want a user at 127.0.0.1:%d", st.SSH.User, st.SSH.Host, st.SSH.Port, st.Ports.SSH)
	}
	if want := fmt.Sprintf("http://127.0.0.1:%d/mcp", st.Ports.MCP); st.MCP.URL != want {
		bad("mcp.url is %q, want %q", st.MCP.URL, want)
	}
	if want := fmt.Sprintf("http://127.0.0.1:%d/health", st.Ports.MCP); st.MCP.HealthURL != want {
		bad("mcp.health_url is %q, want %q", st.MCP.HealthURL, want)
	}
	if st.MCP.Token == "" {
		bad("status shows no mcp.token")
	}
	if !harness.IsDir(st.Paths.Dir) || !harness.IsDir(st.Paths.Workspace) {
		bad("paths.dir %s or paths.workspace %s is not a directory", st.Paths.Dir, st.Paths.Workspace)
	}
	if !harness.Within(st.Paths.Dir, st.Paths.ConsoleLog) {
		bad("paths.console_log %s is not inside the VM's directory", st.Paths.ConsoleLog)
	}
	if len(problems) > 0 {
		return harness.Failf(nil, "status --json of a stopped VM: %s", strings.Join(problems, "; "))
	}
	res, err := s.OK(ctx, "status", st.Branch)
	if err != nil {
		return err
	}
	for _, w := range []string{st.Branch, "stopped", st.Paths.Workspace} {
		if !strings.Contains(res.Stdout, w) {
			return harness.Failf(res, "the text status does not mention %q", w)
		}
	}
	return nil
}

// checkSSHConfig: one Host block for the VM, pointing at files that exist:
// the private key (not readable by others) and the pinned known_hosts.
// OpenSSH's own parser (ssh -G) reads it the same way, when ssh is here.
func checkSSHConfig(ctx context.Context, s *harness.S, st *blackbox.Status) error {
	res, err := s.OK(ctx, "ssh-config", st.Branch)
	if err != nil {
		return err
	}
	hosts, err := harness.ParseSSHConfig(res.Stdout)
	if err != nil {
		return harness.Failf(res, "not an OpenSSH config: %v", err)
	}
	if len(hosts) != 1 || hosts[0].Name != "agent-vm-"+st.Slug {
		return harness.Failf(res, "want exactly one block `Host agent-vm-%s`, got %d: %+v", st.Slug, len(hosts), hosts)
	}
	o := hosts[0].Options
	for k, want := range map[string]string{"hostname": "127.0.0.1", "port": strconv.Itoa(st.Ports.SSH),
		"user": st.SSH.User, "stricthostkeychecking": "yes"} {
		if o[k] != want {
			return harness.Failf(res, "%s is %q, want %q", k, o[k], want)
		}
	}
	id := harness.Unquote(o["identityfile"])
	fi, err := os.Stat(id)
	if err != nil {
		return harness.Failf(res, "IdentityFile: %v", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return harness.Failf(res, "IdentityFile %s has mode %s; a private key must be readable by its owner only", id, fi.Mode().Perm())
	}
	kh := harness.Unquote(o["userknownhostsfile"])
	data, err := os.ReadFile(kh)
	if err != nil {
		return harness.Failf(res, "UserKnownHostsFile: %v", err)
	}
	pin := fmt.Sprintf("[127.0.0.1]:%d ssh-ed25519 ", st.Ports.SSH)
	if !strings.Contains(string(data), pin) {
		return harness.Failf(res, "UserKnownHostsFile %s does not pin an ed25519 host key for [127.0.0.1]:%d:\n%s", kh, st.Ports.SSH, data)
	}
	ssh, err := exec.LookPath("ssh")
	if err != nil {
		s.Notef("ssh not installed: OpenSSH's parser not asked")
		return nil
	}
	cfgFile := filepath.Join(s.Dir(), "ssh_config")
	if err := os.WriteFile(cfgFile, []byte(res.Stdout), 0o600); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, ssh, "-G", "-F", cfgFile, hosts[0].Name).CombinedOutput()
	if err != nil {
		return harness.Failf(res, "OpenSSH rejects the config (ssh -G): %v: %s", err, out)
	}
	for _, w := range []string{"hostname 127.0.0.1\n", fmt.Sprintf("port %d\n", st.Ports.SSH), "stricthostkeychecking true\n"} {
		if !strings.Contains(string(out), w) {
			return harness.Failf(res, "OpenSSH reads the config differently: `ssh -G` lacks %q", strings.TrimSpace(w))
		}
	}
	return nil
}
