package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func cliScenario() Scenario {
	return Scenario{
		Name:    "cli",
		Summary: "VM records without booting: create, list, status, ssh-config, destroy, bad input",
		Verbs:   []string{"create", "list", "status", "destroy", "ssh-config"},
		run:     runCLI,
	}
}

// cliBranch is the branch the cli scenario's VM is made for.
const cliBranch = "itest/cli"

func runCLI(ctx context.Context, s *S) {
	var rp *repo
	var st *vmStatus
	s.Step(ctx, "make a git repo with a bare remote", func() (err error) {
		rp, err = newRepo(ctx, s.dir, nil)
		return err
	})
	s.Step(ctx, "create a VM for a new branch", func() (err error) {
		if _, err := s.create(ctx, rp.Dir, cliBranch); err != nil {
			return err
		}
		st, _, err = s.status(ctx, cliBranch, statusKeys())
		return err
	})
	s.Step(ctx, "its workspace: a clone at the branch, origin and upstream", func() error {
		return checkWorkspace(ctx, s, st, rp, cliBranch)
	})
	s.Step(ctx, "list shows it (table and --json)", func() error { return checkList(ctx, s, st) })
	s.Step(ctx, "status of a stopped VM (text and --json)", func() error { return checkStoppedStatus(ctx, s, st) })
	s.Step(ctx, "ssh-config names its key and its pinned known_hosts", func() error { return checkSSHConfig(ctx, s, st) })
	s.Step(ctx, "a second create of the branch says it already exists", func() error {
		res := s.tryCreate(ctx, rp.Dir, "--branch", cliBranch)
		if err := want(res, 1); err != nil {
			return err
		}
		if !strings.Contains(res.Stderr, "already exists") {
			return failf(res, "the error does not say the VM already exists")
		}
		return nil
	})
	s.Step(ctx, "destroy refuses to lose an unpushed commit", func() error { return checkDestroyRefuses(ctx, s, st) })
	s.Step(ctx, "destroy --force removes the VM and its directory", func() error {
		if _, err := s.ok(ctx, "destroy", "--force", cliBranch); err != nil {
			return err
		}
		return checkGone(ctx, s, cliBranch, st.Paths.Dir)
	})
	s.Step(ctx, "hostile branch names work or fail cleanly", func() error { return checkHostileNames(ctx, s, rp) })
	s.Step(ctx, "a branch whose slug another VM has is refused", func() error { return checkSlugCollision(ctx, s, rp) })
	s.Step(ctx, "an unknown VM is an error with a hint", func() error { return checkUnknownVM(ctx, s) })
	s.Step(ctx, "bad flags, arguments and commands are usage errors", func() error { return checkUsageErrors(ctx, s) })
	s.Step(ctx, "commands work as the usage lines and hints print them", func() error { return checkAsPrinted(ctx, s, rp) })
}

// checkWorkspace: the workspace is a git clone of the source at the
// branch, origin is the source repository and upstream the source's origin.
func checkWorkspace(ctx context.Context, s *S, st *vmStatus, rp *repo, branch string) error {
	ws := st.Paths.Workspace
	if !within(s.av.stateDir, st.Paths.Dir) || !within(st.Paths.Dir, ws) {
		return failf(nil, "the VM's directory %s and workspace %s should lie inside the state directory %s", st.Paths.Dir, ws, s.av.stateDir)
	}
	head, err := git(ctx, ws, "rev-parse", "--abbrev-ref", "HEAD")
	if err != nil {
		return err
	}
	if head != branch {
		return fmt.Errorf("the workspace %s has %q checked out, want %q", ws, head, branch)
	}
	got, _ := git(ctx, ws, "rev-parse", "HEAD")
	wantHead, _ := git(ctx, rp.Dir, "rev-parse", "main")
	if got != wantHead {
		return fmt.Errorf("the new branch starts at %s, want the source's HEAD %s", got, wantHead)
	}
	origin, err := git(ctx, ws, "remote", "get-url", "origin")
	if err != nil {
		return err
	}
	if !samePath(strings.TrimPrefix(origin, "file://"), rp.Dir) {
		return fmt.Errorf("the workspace's origin is %q, want the source repository %s", origin, rp.Dir)
	}
	upstream, err := git(ctx, ws, "remote", "get-url", "upstream")
	if err != nil {
		return fmt.Errorf("the workspace has no upstream remote (the source's own origin): %w", err)
	}
	if !samePath(strings.TrimPrefix(upstream, "file://"), rp.Remote) {
		return fmt.Errorf("the workspace's upstream is %q, want the source's origin %s", upstream, rp.Remote)
	}
	if !samePath(st.Git.Source, rp.Dir) {
		return failf(nil, "status says git.source %q, want %s", st.Git.Source, rp.Dir)
	}
	return nil
}

// checkList: the VM's row in the table and its object in --json agree with
// its status.
func checkList(ctx context.Context, s *S, st *vmStatus) error {
	res, err := s.ok(ctx, "list")
	if err != nil {
		return err
	}
	header, rows, err := parseTable(res.Stdout)
	if err != nil {
		return failf(res, "%v", err)
	}
	wantHeader := []string{"BRANCH", "BACKEND", "STATE", "SSH", "MCP", "CREATED"}
	if len(header) < len(wantHeader) || strings.Join(header[:len(wantHeader)], " ") != strings.Join(wantHeader, " ") {
		return failf(res, "the table's columns are %q, want %q", header, wantHeader)
	}
	var row map[string]string
	for _, r := range rows {
		if r["BRANCH"] == st.Branch {
			row = r
		}
	}
	if row == nil {
		return failf(res, "the table has no row for %q", st.Branch)
	}
	for col, want := range map[string]string{"BACKEND": st.Backend, "STATE": "stopped",
		"SSH": strconv.Itoa(st.Ports.SSH), "MCP": strconv.Itoa(st.Ports.MCP)} {
		if row[col] != want {
			return failf(res, "the %s column of %q says %q, want %q", col, st.Branch, row[col], want)
		}
	}

	res, err = s.ok(ctx, "list", "--json")
	if err != nil {
		return err
	}
	list, raw, err := parseList([]byte(res.Stdout))
	if err != nil {
		return failf(res, "%v", err)
	}
	for i, o := range list {
		if o.Branch != st.Branch {
			continue
		}
		if _, err := parseStatus(mustJSON(raw[i]), statusKeys()); err != nil {
			return failf(res, "its entry: %v", err)
		}
		if o.MCP.Token != "" {
			return failf(res, "list --json shows the MCP token; only status may")
		}
		if o.State != "stopped" || o.Ports != st.Ports || o.Slug != st.Slug {
			return failf(res, "its entry says state %q, ports %+v, slug %q; status says stopped, %+v, %q", o.State, o.Ports, o.Slug, st.Ports, st.Slug)
		}
		return nil
	}
	return failf(res, "list --json has no entry for %q", st.Branch)
}

func mustJSON(m map[string]json.RawMessage) []byte {
	b, _ := json.Marshal(m)
	return b
}

// checkStoppedStatus: the documented fields of a stopped VM hold sensible
// values, and the text form says the same.
func checkStoppedStatus(ctx context.Context, s *S, st *vmStatus) error {
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
	if !isDir(st.Paths.Dir) || !isDir(st.Paths.Workspace) {
		bad("paths.dir %s or paths.workspace %s is not a directory", st.Paths.Dir, st.Paths.Workspace)
	}
	if !within(st.Paths.Dir, st.Paths.ConsoleLog) {
		bad("paths.console_log %s is not inside the VM's directory", st.Paths.ConsoleLog)
	}
	if len(problems) > 0 {
		return failf(nil, "status --json of a stopped VM: %s", strings.Join(problems, "; "))
	}
	res, err := s.ok(ctx, "status", st.Branch)
	if err != nil {
		return err
	}
	for _, w := range []string{st.Branch, "stopped", st.Paths.Workspace} {
		if !strings.Contains(res.Stdout, w) {
			return failf(res, "the text status does not mention %q", w)
		}
	}
	return nil
}

// checkSSHConfig: one Host block for the VM, pointing at files that exist:
// the private key (not readable by others) and the pinned known_hosts.
// OpenSSH's own parser (ssh -G) reads it the same way, when ssh is here.
func checkSSHConfig(ctx context.Context, s *S, st *vmStatus) error {
	res, err := s.ok(ctx, "ssh-config", st.Branch)
	if err != nil {
		return err
	}
	hosts, err := parseSSHConfig(res.Stdout)
	if err != nil {
		return failf(res, "not an OpenSSH config: %v", err)
	}
	if len(hosts) != 1 || hosts[0].Name != "agent-vm-"+st.Slug {
		return failf(res, "want exactly one block `Host agent-vm-%s`, got %d: %+v", st.Slug, len(hosts), hosts)
	}
	o := hosts[0].Options
	for k, want := range map[string]string{"hostname": "127.0.0.1", "port": strconv.Itoa(st.Ports.SSH),
		"user": st.SSH.User, "stricthostkeychecking": "yes"} {
		if o[k] != want {
			return failf(res, "%s is %q, want %q", k, o[k], want)
		}
	}
	id := unquote(o["identityfile"])
	fi, err := os.Stat(id)
	if err != nil {
		return failf(res, "IdentityFile: %v", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return failf(res, "IdentityFile %s has mode %s; a private key must be readable by its owner only", id, fi.Mode().Perm())
	}
	kh := unquote(o["userknownhostsfile"])
	data, err := os.ReadFile(kh)
	if err != nil {
		return failf(res, "UserKnownHostsFile: %v", err)
	}
	pin := fmt.Sprintf("[127.0.0.1]:%d ssh-ed25519 ", st.Ports.SSH)
	if !strings.Contains(string(data), pin) {
		return failf(res, "UserKnownHostsFile %s does not pin an ed25519 host key for [127.0.0.1]:%d:\n%s", kh, st.Ports.SSH, data)
	}
	ssh, err := exec.LookPath("ssh")
	if err != nil {
		s.notef("ssh not installed: OpenSSH's parser not asked")
		return nil
	}
	cfgFile := filepath.Join(s.dir, "ssh_config")
	if err := os.WriteFile(cfgFile, []byte(res.Stdout), 0o600); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, ssh, "-G", "-F", cfgFile, hosts[0].Name).CombinedOutput()
	if err != nil {
		return failf(res, "OpenSSH rejects the config (ssh -G): %v: %s", err, out)
	}
	for _, w := range []string{"hostname 127.0.0.1\n", fmt.Sprintf("port %d\n", st.Ports.SSH), "stricthostkeychecking true\n"} {
		if !strings.Contains(string(out), w) {
			return failf(res, "OpenSSH reads the config differently: `ssh -G` lacks %q", strings.TrimSpace(w))
		}
	}
	return nil
}

// checkDestroyRefuses commits in the workspace without pushing; destroy
// must refuse (exit 1), say which commit would be lost, and keep the VM.
func checkDestroyRefuses(ctx context.Context, s *S, st *vmStatus) error {
	subject := "itest: unpushed work " + randHex(4)
	ws := st.Paths.Workspace
	if err := os.WriteFile(filepath.Join(ws, "unpushed.txt"), []byte(subject+"\n"), 0o644); err != nil {
		return err
	}
	if _, err := git(ctx, ws, "add", "unpushed.txt"); err != nil {
		return err
	}
	if _, err := git(ctx, ws, "commit", "--quiet", "-m", subject); err != nil {
		return err
	}
	hash, _ := git(ctx, ws, "rev-parse", "--short", "HEAD")
	res := s.agentVM(ctx, "destroy", st.Branch)
	if err := want(res, 1); err != nil {
		return err
	}
	report := res.Stdout + res.Stderr
	if !strings.Contains(report, subject) && !strings.Contains(report, hash) {
		return failf(res, "the refusal does not name the unpushed commit %s %q", hash, subject)
	}
	if !isDir(st.Paths.Dir) {
		return failf(res, "destroy refused, yet %s is gone", st.Paths.Dir)
	}
	_, err := s.ok(ctx, "status", "--json", st.Branch)
	return err
}

// checkAsPrinted runs agent-vm the way its usage lines (`status [BRANCH]
// [--json]`) and its own hints write commands, flags after the branch: the
// command a refused destroy suggests must do what it says.
func checkAsPrinted(ctx context.Context, s *S, rp *repo) error {
	const branch = "itest/hint"
	if _, err := s.create(ctx, rp.Dir, branch); err != nil {
		return err
	}
	res := s.agentVM(ctx, "status", branch, "--json")
	if err := want(res, 0); err != nil {
		return err
	}
	st, err := parseStatus([]byte(res.Stdout), statusKeys())
	if err != nil {
		return failf(res, "%v", err)
	}
	if _, err := git(ctx, st.Paths.Workspace, "commit", "--quiet", "--allow-empty", "-m", "itest: unpushed"); err != nil {
		return err
	}
	res = s.agentVM(ctx, "destroy", branch)
	if err := want(res, 1); err != nil {
		return err
	}
	var hint string
	for _, l := range strings.Split(res.Stdout+res.Stderr, "\n") {
		if i := strings.Index(l, "agent-vm destroy "); i >= 0 && strings.Contains(l, "--force") {
			hint = strings.Trim(l[i:], " `.")
		}
	}
	if hint == "" {
		return failf(res, "the refusal suggests no `agent-vm destroy ... --force` command")
	}
	args, err := shellSplit(strings.TrimPrefix(hint, "agent-vm "))
	if err != nil {
		return failf(res, "the suggested command %q: %v", hint, err)
	}
	res = s.agentVM(ctx, args...)
	if err := want(res, 0); err != nil {
		return failf(res, "the command the refusal suggests, `%s`, fails: %s", hint, res.Outcome())
	}
	return checkGone(ctx, s, branch, st.Paths.Dir)
}

// shellSplit splits a command line the way a POSIX shell would, for the
// quoting agent-vm prints: single and double quotes, backslashes.
func shellSplit(line string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unterminated single quote")
			}
			cur.WriteString(line[i+1 : i+1+j])
			i, inWord = i+1+j, true
		case c == '"':
			i++
			for ; i < len(line) && line[i] != '"'; i++ {
				if line[i] == '\\' && i+1 < len(line) {
					i++
				}
				cur.WriteByte(line[i])
			}
			if i >= len(line) {
				return nil, fmt.Errorf("unterminated double quote")
			}
			inWord = true
		case c == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
			inWord = true
		case c == ' ' || c == '\t':
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out, nil
}

// checkGone: the VM is unknown to agent-vm and its directory is gone.
func checkGone(ctx context.Context, s *S, branch, dir string) error {
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		return failf(nil, "%s still exists after destroy (%v)", dir, err)
	}
	res := s.agentVM(ctx, "status", "--json", branch)
	return want(res, 1)
}

// checkUnknownVM: asking about a VM that does not exist is exit 1 with the
// name and a hint on stderr, and nothing on stdout.
func checkUnknownVM(ctx context.Context, s *S) error {
	name := "no-such-vm-" + randHex(3)
	for _, args := range [][]string{{"status", name}, {"status", "--json", name}, {"destroy", name}, {"ssh-config", name}} {
		res := s.agentVM(ctx, args...)
		if err := want(res, 1); err != nil {
			return err
		}
		if !strings.HasPrefix(lastLine(res.Stderr), "agent-vm: ") || !strings.Contains(res.Stderr, name) || !strings.Contains(res.Stderr, "hint") {
			return failf(res, "want an `agent-vm: ...` error naming %q with a hint on stderr", name)
		}
		if strings.TrimSpace(res.Stdout) != "" {
			return failf(res, "an error printed data on stdout")
		}
	}
	return nil
}

// checkUsageErrors: mistakes in how agent-vm is called are exit 2, say what
// was wrong, and suggest the command that was probably meant.
func checkUsageErrors(ctx context.Context, s *S) error {
	cases := []struct {
		args     []string
		mentions string
	}{
		{[]string{"list", "--bogus-flag"}, "bogus-flag"},
		{[]string{"statu"}, `"status"`},
		{[]string{"destory", "x"}, `"destroy"`},
		{[]string{"status", "a", "b"}, "status"},
		{[]string{"--log-format", "xml", "list"}, "xml"},
		{[]string{"create", "--cpus", "0"}, "cpus"},
	}
	for _, c := range cases {
		res := s.agentVM(ctx, c.args...)
		if err := want(res, 2); err != nil {
			return err
		}
		if !strings.Contains(res.Stderr, c.mentions) {
			return failf(res, "the usage error does not mention %s", c.mentions)
		}
		if strings.Contains(res.Stderr, "goroutine ") {
			return failf(res, "agent-vm crashed")
		}
	}
	return nil
}

// isDir reports whether p is a directory.
func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// within reports whether p lies inside dir (not dir itself).
func within(dir, p string) bool {
	rel, err := filepath.Rel(canonical(dir), canonical(p))
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../") && !filepath.IsAbs(rel)
}

// samePath reports whether a and b name the same place.
func samePath(a, b string) bool { return canonical(a) == canonical(b) }

// canonical is p, absolute, cleaned, with the symlinks of its existing
// part resolved (/tmp may be a link).
func canonical(p string) string {
	p = filepath.Clean(p)
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	if r, err := filepath.EvalSymlinks(filepath.Dir(p)); err == nil {
		return filepath.Join(r, filepath.Base(p))
	}
	return p
}

// unquote strips the double quotes OpenSSH allows around a value.
func unquote(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return s[1 : len(s)-1]
	}
	return s
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails: it crashes the program instead (Go 1.24)
	return hex.EncodeToString(b)
}
