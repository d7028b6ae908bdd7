package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/hostsetup"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// These tests run the real command line (in process, with buffers, or as a
// built binary where processes matter) against real git repositories in temp
// dirs. Nothing is faked.

type result struct {
	code   int
	stdout string
	stderr string
}

// agentVM runs the CLI in process, in dir, with the state dir given. An
// empty dir is a directory outside any git repository (the test's own
// working directory is inside agent-vm's checkout).
func agentVM(t *testing.T, dir, stateDir string, args ...string) result {
	t.Helper()
	return agentVMEnv(t, dir, stateDir, nil, args...)
}

// agentVMEnv is agentVM with more environment variables (a HOME of its
// own, say) over the test's HOME and NO_COLOR.
func agentVMEnv(t *testing.T, dir, stateDir string, extra map[string]string, args ...string) result {
	t.Helper()
	return agentVMIn(t, dir, stateDir, os.Stdin, extra, args...)
}

// agentVMIn is agentVMEnv with in as the standard input.
func agentVMIn(t *testing.T, dir, stateDir string, in *os.File, extra map[string]string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	wd, _ := os.Getwd()
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	defer os.Chdir(wd)
	env := map[string]string{"HOME": os.Getenv("HOME"), "NO_COLOR": "1"}
	for k, v := range extra {
		env[k] = v
	}
	code := Main(context.Background(), append([]string{"agent-vm", "--state-dir", stateDir}, args...),
		IO{In: in, Out: &out, Err: &errb, Getenv: func(k string) string { return env[k] }})
	return result{code, out.String(), errb.String()}
}

func mustRun(t *testing.T, dir, stateDir string, args ...string) result {
	t.Helper()
	r := agentVM(t, dir, stateDir, args...)
	if r.code != 0 {
		t.Fatalf("agent-vm %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}

func statusJSON(t *testing.T, stateDir, branch string) map[string]any {
	t.Helper()
	r := mustRun(t, "", stateDir, "status", branch, "--json")
	var m map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &m); err != nil {
		t.Fatalf("status --json is not JSON: %v\n%s", err, r.stdout)
	}
	return m
}

func TestCreateListStatusSSHConfigDestroy(t *testing.T) {
	repo := tu.Repo(t, true)
	st := t.TempDir()
	r := mustRun(t, repo, st, "create", "feature/x", "--backend", "qemu", "--memory", "1G", "--cpus", "1")
	if !strings.Contains(r.stdout, "feature-x") || !strings.Contains(r.stdout, "agent-vm start feature-x") {
		t.Errorf("create output:\n%s", r.stdout)
	}

	// list: the table and the JSON agree.
	r = mustRun(t, "", st, "list")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "BRANCH") || !strings.Contains(lines[1], "feature/x") || !strings.Contains(lines[1], "stopped") {
		t.Errorf("list:\n%s", r.stdout)
	}
	r = mustRun(t, "", st, "list", "--json")
	var list []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 1 {
		t.Fatalf("list --json: %v\n%s", err, r.stdout)
	}
	if _, ok := list[0]["mcp"].(map[string]any)["token"]; ok {
		t.Error("list --json shows the MCP token")
	}

	// status --json carries the documented fields.
	s := statusJSON(t, st, "feature/x")
	for _, k := range []string{"branch", "slug", "backend", "state", "created_at", "ports", "resources", "agent", "ssh", "mcp", "paths", "git"} {
		if _, ok := s[k]; !ok {
			t.Errorf("status --json lacks %q", k)
		}
	}
	if s["state"] != "stopped" || s["branch"] != "feature/x" || s["slug"] != "feature-x" || s["backend"] != "qemu" {
		t.Errorf("status: %v", s)
	}
	if res := s["resources"].(map[string]any); res["memory_mib"] != 1024.0 || res["cpus"] != 1.0 {
		t.Errorf("resources %v", res)
	}
	if tok, _ := s["mcp"].(map[string]any)["token"].(string); len(tok) != 64 {
		t.Errorf("status --json token %q", tok)
	}
	if r := mustRun(t, "", st, "status", "feature-x"); !strings.Contains(r.stdout, "state:      stopped") {
		t.Errorf("status by slug:\n%s", r.stdout)
	}

	// ssh-config names the pinned known_hosts and the key.
	r = mustRun(t, "", st, "ssh-config")
	l := state.Layout{Dir: filepath.Join(st, "feature-x")}
	for _, want := range []string{"Host agent-vm-feature-x", "HostName 127.0.0.1", "User dev", "IdentityFile " + l.ClientKey(),
		"UserKnownHostsFile " + l.KnownHosts(), "StrictHostKeyChecking yes"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("ssh-config lacks %q:\n%s", want, r.stdout)
		}
	}

	// A clean workspace is destroyed without --force; nothing remains.
	r = mustRun(t, "", st, "destroy", "feature/x")
	if _, err := os.Stat(l.Dir); !os.IsNotExist(err) {
		t.Errorf("VM dir still there after destroy: %v", err)
	}
	if r := mustRun(t, "", st, "list"); !strings.Contains(r.stdout, "no VMs") {
		t.Errorf("list after destroy:\n%s", r.stdout)
	}
}

// fork, from the checked-out branch's VM or --vm's, prints what it made
// (the table and the JSON) and the next step; the forks are VMs like any.
func TestForkPrintsWhatItMade(t *testing.T) {
	repo := tu.Repo(t, true)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "--backend", "qemu", "--memory", "1G", "--cpus", "1") // main's VM
	mustRun(t, repo, st, "port", "add", "--vm", "main", "3000", "3999")
	r := mustRun(t, repo, st, "fork", "try-a")
	for _, want := range []string{"forked main (stopped) into:", "try-a  branch try-a at ", "its disk is made at its first start",
		"forwards (guest->host, as the source's, on ports of its own): 3000->3000", "next: agent-vm start try-a"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("fork's output lacks %q:\n%s", want, r.stdout)
		}
	}
	r = mustRun(t, "", st, "fork", "--vm", "main", "--json", "try-b", "try-c")
	var out struct {
		Source, State string
		Forks         []struct {
			Branch, Slug, Commit string
			Ports                struct{ SSH, MCP int }
		}
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("fork --json: %v\n%s", err, r.stdout)
	}
	if out.Source != "main" || out.State != "stopped" || len(out.Forks) != 2 || out.Forks[1].Branch != "try-c" || out.Forks[1].Ports.SSH == 0 || len(out.Forks[1].Commit) != 40 {
		t.Errorf("fork --json: %+v", out)
	}
	if r := mustRun(t, "", st, "list"); strings.Count(r.stdout, "stopped") != 4 {
		t.Errorf("list after the forks:\n%s", r.stdout)
	}
}

// checkpoint, checkpoint list, rollback and checkpoint rm, as a user types
// them: what each prints.
func TestCheckpointCommands(t *testing.T) {
	repo := tu.Repo(t, true)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "--backend", "qemu", "--memory", "1G", "--cpus", "1")
	r := mustRun(t, repo, st, "checkpoint", "one")
	for _, want := range []string{"checkpoint one of main: workspace ", "no disk yet", "agent-vm rollback --vm main one"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("checkpoint's output lacks %q:\n%s", want, r.stdout)
		}
	}
	r = mustRun(t, repo, st, "checkpoint", "list")
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME") || !strings.HasPrefix(lines[1], "one ") {
		t.Errorf("checkpoint list:\n%s", r.stdout)
	}
	r = mustRun(t, repo, st, "rollback", "one")
	if !strings.Contains(r.stdout, "rolled main back to checkpoint one") || !strings.Contains(r.stdout, "agent-vm rollback --vm main before-rollback-") {
		t.Errorf("rollback's output:\n%s", r.stdout)
	}
	mustRun(t, repo, st, "checkpoint", "rm", "one")
	r = mustRun(t, "", st, "checkpoint", "list", "main", "--json")
	var cs []struct{ Name, Replaced string }
	if err := json.Unmarshal([]byte(r.stdout), &cs); err != nil || len(cs) != 1 || cs[0].Replaced != "one" {
		t.Errorf("checkpoint list --json after rm: %v\n%s", err, r.stdout)
	}
}

// checkpoint --every sets the VM's automatic checkpoints and says so, 0
// stops them; what it cannot take is refused before anything changes.
func TestCheckpointEvery(t *testing.T) {
	repo := tu.Repo(t, true)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "--backend", "qemu", "--memory", "1G", "--cpus", "1")
	r := mustRun(t, repo, st, "checkpoint", "--every", "15m", "--keep", "3")
	if !strings.Contains(r.stdout, "VM main takes a checkpoint every 15m0s while its agent works") || !strings.Contains(r.stdout, "keeping the newest 3") {
		t.Errorf("checkpoint --every said:\n%s", r.stdout)
	}
	if s := statusJSON(t, st, "main"); s["state"] != "stopped" {
		t.Errorf("status after --every: %v", s["state"])
	}
	rec, err := state.ReadRecord(state.Layout{Dir: filepath.Join(st, "main")}.Record())
	if err != nil || rec.AutoCheckpoint == nil || rec.AutoCheckpoint.Every != "15m0s" || rec.AutoCheckpoint.Keep != 3 {
		t.Fatalf("the record's schedule: %+v, %v", rec, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"checkpoint", "--every", "5s"}, `checkpoint interval "5s": give a duration of 10s or more`},
		{[]string{"checkpoint", "--every", "soon"}, `checkpoint interval "soon"`},
		{[]string{"checkpoint", "--every", "10m", "name"}, "--every and --auto name no checkpoint"},
		{[]string{"checkpoint", "--every", "10m", "--auto"}, "--every and --auto name no checkpoint"},
		{[]string{"checkpoint", "auto-mine"}, "which is the automatic checkpoints'"},
	} {
		if r := agentVM(t, repo, st, tc.args...); r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("agent-vm %s: exit %d, %q; want a refusal saying %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.want)
		}
	}
	if rec, _ := state.ReadRecord(state.Layout{Dir: filepath.Join(st, "main")}.Record()); rec.AutoCheckpoint == nil || rec.AutoCheckpoint.Every != "15m0s" {
		t.Errorf("a refusal changed the schedule: %+v", rec.AutoCheckpoint)
	}
	r = mustRun(t, repo, st, "checkpoint", "--every", "0")
	if !strings.Contains(r.stdout, "VM main takes no automatic checkpoints") {
		t.Errorf("checkpoint --every 0 said:\n%s", r.stdout)
	}
	r = mustRun(t, repo, st, "checkpoint", "--auto")
	if !strings.Contains(r.stdout, "checkpoint auto-") {
		t.Errorf("checkpoint --auto said:\n%s", r.stdout)
	}
	if r := agentVM(t, repo, st, "run", "--checkpoint-every", "1s"); r.code == 0 || !strings.Contains(r.stderr, "--checkpoint-every: checkpoint interval \"1s\"") {
		t.Errorf("run --checkpoint-every 1s: exit %d, %q", r.code, r.stderr)
	}
}

func TestCreateDefaultsToTheCurrentBranchAndSetsRemotes(t *testing.T) {
	repo := tu.Repo(t, true)
	tu.Git(t, repo, "checkout", "--quiet", "-b", "topic")
	st := t.TempDir()
	mustRun(t, repo, st, "create", "--backend", "qemu")
	ws := filepath.Join(st, "topic", "workspace")
	if got := tu.Git(t, ws, "symbolic-ref", "--short", "HEAD"); got != "topic" {
		t.Errorf("workspace on %q", got)
	}
	if got := tu.Git(t, ws, "remote", "get-url", "origin"); got != "file://"+repo {
		t.Errorf("origin %q", got)
	}
	if got := tu.Git(t, ws, "remote", "get-url", "upstream"); got != filepath.Join(filepath.Dir(repo), "remote.git") {
		t.Errorf("upstream %q", got)
	}
	// status/destroy without BRANCH mean the current branch too.
	if r := mustRun(t, repo, st, "status", "--json"); !strings.Contains(r.stdout, `"branch": "topic"`) {
		t.Errorf("status without BRANCH:\n%s", r.stdout)
	}
}

func TestKeysPermissionsAndPinnedHostKey(t *testing.T) {
	repo := tu.Repo(t, false)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "k", "--backend", "qemu")
	l := state.Layout{Dir: filepath.Join(st, "k")}
	modes := map[string]os.FileMode{l.Dir: 0o700, l.SSHDir(): 0o700, l.SecretsDir(): 0o700, l.ClientKey(): 0o600,
		l.HostKey(): 0o600, l.MCPToken(): 0o600, l.Record(): 0o600, l.KnownHosts(): 0o600}
	for p, want := range modes {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode().Perm(), want)
		}
	}
	// The known_hosts line parses with x/crypto/ssh/knownhosts and pins
	// exactly the guest's host key on the VM's SSH port.
	hostPub, err := os.ReadFile(l.HostPubKey())
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey(hostPub)
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := state.ReadRecord(l.Record())
	cb, err := knownhosts.New(l.KnownHosts())
	if err != nil {
		t.Fatal(err)
	}
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: rec.Ports.SSH}
	if err := cb(addr.String(), addr, pub); err != nil {
		t.Errorf("the pinned key is not accepted for %s: %v", addr, err)
	}
	// The client key is a usable ed25519 key.
	b, _ := os.ReadFile(l.ClientKey())
	if signer, err := ssh.ParsePrivateKey(b); err != nil || signer.PublicKey().Type() != ssh.KeyAlgoED25519 {
		t.Errorf("client key: %v", err)
	}
}

func TestSlugCollisionsAndDuplicatesAreRefused(t *testing.T) {
	repo := tu.Repo(t, false)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "feature/x", "--backend", "qemu")
	r := agentVM(t, repo, st, "create", "feature-x", "--backend", "qemu")
	if r.code != 1 || !strings.Contains(r.stderr, `"feature/x"`) || !strings.Contains(r.stderr, "already uses") {
		t.Errorf("colliding branch: exit %d\n%s", r.code, r.stderr)
	}
	r = agentVM(t, repo, st, "create", "feature/x", "--backend", "qemu")
	if r.code != 1 || !strings.Contains(r.stderr, "already exists") {
		t.Errorf("duplicate: exit %d\n%s", r.code, r.stderr)
	}
	r = agentVM(t, repo, st, "create", "bad..name", "--backend", "qemu")
	if r.code != 1 || !strings.Contains(r.stderr, `"bad..name"`) {
		t.Errorf("invalid branch: exit %d\n%s", r.code, r.stderr)
	}
	entries, _ := os.ReadDir(st)
	var names []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	if len(names) != 1 {
		t.Errorf("state dir holds %v; refused creates must leave nothing", names)
	}
}

func TestPortsAreUniqueAcross20Creates(t *testing.T) {
	repo := tu.Repo(t, false)
	st := t.TempDir()
	// A port something else listens on is skipped.
	ln, err := net.Listen("tcp", "127.0.0.1:8000")
	if err == nil {
		defer ln.Close()
	}
	seen := map[float64]string{}
	for i := 0; i < 20; i++ {
		branch := "b" + string(rune('a'+i))
		mustRun(t, repo, st, "create", branch, "--backend", "qemu")
		p := statusJSON(t, st, branch)["ports"].(map[string]any)
		for _, k := range []string{"ssh", "mcp"} {
			port := p[k].(float64)
			if owner, dup := seen[port]; dup {
				t.Errorf("%s port %v of %s is also %s", k, port, branch, owner)
			}
			seen[port] = branch + " " + k
			if ln != nil && port == 8000 {
				t.Errorf("port 8000 is listening but was given to %s", branch)
			}
		}
	}
	// --port pins the MCP port, and a taken one is refused.
	mustRun(t, repo, st, "create", "pinned", "--backend", "qemu", "--port", "8600")
	if p := statusJSON(t, st, "pinned")["ports"].(map[string]any); p["mcp"] != 8600.0 {
		t.Errorf("--port 8600 gave %v", p["mcp"])
	}
	r := agentVM(t, repo, st, "create", "pinned2", "--backend", "qemu", "--port", "8600")
	if r.code != 1 || !strings.Contains(r.stderr, "8600") {
		t.Errorf("a taken --port: exit %d\n%s", r.code, r.stderr)
	}
	// --ssh-port pins the SSH port; a taken one (another VM's, or one a
	// program listens on) and a bad one are refused, naming the flag.
	sshPort := tu.FreePort(t)
	mustRun(t, repo, st, "create", "pinned-ssh", "--backend", "qemu", "--ssh-port", strconv.Itoa(sshPort))
	if p := statusJSON(t, st, "pinned-ssh")["ports"].(map[string]any); p["ssh"] != float64(sshPort) {
		t.Errorf("--ssh-port %d gave %v", sshPort, p["ssh"])
	}
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	for _, tc := range []struct {
		port      string
		code      int
		wantError string
	}{
		{strconv.Itoa(sshPort), 1, "is already used by"},
		{strconv.Itoa(held.Addr().(*net.TCPAddr).Port), 1, "in use on 127.0.0.1 by another program"},
		{"80", 2, "--ssh-port 80: must be between 1024 and 65535"},
		{"8600", 2, "--ssh-port and --port are both 8600"},
	} {
		args := []string{"create", "pinned-ssh2", "--backend", "qemu", "--ssh-port", tc.port}
		if tc.port == "8600" {
			args = append(args, "--port", "8600")
		}
		r := agentVM(t, repo, st, args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.wantError) || !strings.Contains(r.stderr, "ssh-port") {
			t.Errorf("--ssh-port %s: exit %d, want %d saying %q:\n%s", tc.port, r.code, tc.code, tc.wantError, r.stderr)
		}
	}
}

// agentCommitted creates the VM of branch w of repo (stopped) and commits
// "agent's work" in its workspace, which it returns.
func agentCommitted(t *testing.T, repo, st string) (ws string) {
	t.Helper()
	mustRun(t, repo, st, "create", "w", "--backend", "qemu")
	ws = filepath.Join(st, "w", "workspace")
	tu.WriteFile(t, filepath.Join(ws, "agent.txt"), "work\n")
	tu.Git(t, ws, "add", ".")
	tu.Git(t, ws, "commit", "--quiet", "-m", "agent's work")
	return ws
}

func TestDestroyRefusesUnsavedWorkAndForceOverrides(t *testing.T) {
	repo := tu.Repo(t, true)
	st := t.TempDir()
	ws := agentCommitted(t, repo, st)
	tu.WriteFile(t, filepath.Join(ws, "notes.txt"), "untracked\n")
	r := agentVM(t, "", st, "destroy", "w")
	if r.code != 1 {
		t.Fatalf("destroy with unsaved work: exit %d", r.code)
	}
	for _, want := range []string{"agent's work", "notes.txt", "-C " + ws + " push origin w", "--force"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("refusal lacks %q:\n%s", want, r.stderr)
		}
	}
	if _, err := os.Stat(ws); err != nil {
		t.Fatalf("a refused destroy removed the workspace: %v", err)
	}
	mustRun(t, "", st, "destroy", "w", "--force")
	if _, err := os.Stat(filepath.Dir(ws)); !os.IsNotExist(err) {
		t.Errorf("destroy --force left %s", filepath.Dir(ws))
	}
	if _, err := os.Stat(filepath.Join(repo, "README.md")); err != nil {
		t.Errorf("destroy touched the source repository: %v", err)
	}
}

func TestCorruptRecordIsAnInvalidRow(t *testing.T) {
	repo := tu.Repo(t, false)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "good", "--backend", "qemu")
	mustRun(t, repo, st, "create", "broken", "--backend", "qemu")
	os.WriteFile(filepath.Join(st, "broken", "config.json"), []byte("{ this is not json"), 0o600)
	r := mustRun(t, "", st, "list")
	if !strings.Contains(r.stdout, "good") || !strings.Contains(r.stdout, "invalid") || !strings.Contains(r.stdout, "not valid JSON") {
		t.Errorf("list:\n%s", r.stdout)
	}
	r = mustRun(t, "", st, "list", "--json")
	var list []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 2 {
		t.Fatalf("list --json: %v\n%s", err, r.stdout)
	}
	if list[0]["state"] != "invalid" || list[0]["error"] == "" {
		t.Errorf("broken row: %v", list[0])
	}
	// destroy needs --force for it, and then works.
	if r := agentVM(t, "", st, "destroy", "broken"); r.code != 1 || !strings.Contains(r.stderr, "--force") {
		t.Errorf("destroy of a broken record: exit %d\n%s", r.code, r.stderr)
	}
	mustRun(t, "", st, "destroy", "broken", "--force")
}

func TestUsageErrorsAndExitCodes(t *testing.T) {
	st := t.TempDir()
	// The hosts registry is the configuration directory's: one of the
	// test's own, with host big in it.
	env := map[string]string{"XDG_CONFIG_HOME": t.TempDir()}
	if r := agentVMEnv(t, "", st, env, "host", "add", "big", "qemu+ssh://ann@big.example.com/system"); r.code != 0 {
		t.Fatalf("host add: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"lsit"}, 2, `did you mean "list"`},
		{[]string{"destory"}, 2, `did you mean "destroy"`},
		{[]string{"create", "--bogus"}, 2, "bogus"},
		{[]string{"create", "--backend", "docker"}, 2, "--backend"},
		{[]string{"create", "--memory", "lots"}, 2, "--memory"},
		{[]string{"status", "a", "b"}, 2, "at most one"},
		{[]string{"status", "nope"}, 1, "agent-vm list"},
		{[]string{"sync", "a", "b"}, 2, "sync takes at most one BRANCH"},
		{[]string{"sync", "--bogus"}, 2, "bogus"},
		{[]string{"sync", "nope"}, 1, "agent-vm list"},
		{[]string{"--log-format", "xml", "list"}, 2, "text or json"},
		{[]string{"completion", "tcsh"}, 2, "bash, zsh or fish"},
		{[]string{"exec", "x"}, 2, "exec needs a command"},
		{[]string{"logs", "x", "-n", "-1"}, 2, "--lines -1 must be at least 1 (hint: "},
		{[]string{"logs", "-n", "0", "x"}, 2, "--lines 0 must be at least 1 (hint: "},
		{[]string{"host", "bogus"}, 2, `unknown command "host bogus"`},
		{[]string{"host", "add"}, 2, "host add takes NAME URI, got 0 arguments"},
		{[]string{"host", "add", "big"}, 2, "host add takes NAME URI, got 1 arguments"},
		{[]string{"host", "add", "Big", "qemu:///system"}, 1, `host name "Big" is not a short name`},
		{[]string{"host", "add", "local", "qemu:///system"}, 1, "kept for this machine"},
		{[]string{"host", "add", "other", "qemu+tcp://server/system"}, 1, "no authentication"},
		{[]string{"host", "add", "other", "qemu+ssh://server/system?no_verify=1"}, 1, "skips ssh's host key check"},
		{[]string{"host", "add", "big", "qemu:///system"}, 1, "`agent-vm host rm big` first"},
		{[]string{"host", "rm"}, 2, "host rm takes one NAME, got 0 arguments"},
		{[]string{"host", "rm", "nope"}, 1, "host nope: no such host; the hosts are big"},
		{[]string{"host", "doctor"}, 2, "host doctor takes one NAME"},
		{[]string{"host", "doctor", "nope"}, 1, "host nope: no such host; the hosts are big"},
		{[]string{"host", "list", "extra"}, 2, "list takes no arguments"},
		{[]string{"fork"}, 2, "fork takes at least one NEW branch name"},
		{[]string{"fork", "--vm", "nope", "x"}, 1, "agent-vm list"},
		{[]string{"checkpoint", "a", "b"}, 2, "checkpoint takes at most one NAME"},
		{[]string{"checkpoint", "rm"}, 2, "checkpoint rm takes one NAME"},
		{[]string{"rollback"}, 2, "rollback takes one checkpoint NAME"},
		{[]string{"rollback", "--vm", "nope", "x"}, 1, "agent-vm list"},
		{[]string{"version"}, 0, ""},
	}
	for _, c := range cases {
		r := agentVMEnv(t, t.TempDir(), st, env, c.args...)
		if r.code != c.code || !strings.Contains(r.stderr+r.stdout, c.want) {
			t.Errorf("agent-vm %v: exit %d (want %d)\n%s%s", c.args, r.code, c.code, r.stdout, r.stderr)
		}
		if c.code == cmdline.ExitUsage && (r.stdout != "" || !strings.HasPrefix(r.stderr, "agent-vm: ") || strings.Count(r.stderr, "\n") > 2) {
			t.Errorf("agent-vm %v: want a short usage error on stderr, got stdout:\n%s\nstderr:\n%s", c.args, r.stdout, r.stderr)
		}
	}
}

// TestMain removes the agent-vm binary the tests built, once they are done.
func TestMain(m *testing.M) {
	code := m.Run()
	tu.RemoveAgentVMBinary()
	os.Exit(code)
}

func TestConcurrentCreatesOfOneBranchExactlyOneWins(t *testing.T) {
	bin := tu.AgentVMBinary(t)
	repo := tu.Repo(t, false)
	st := t.TempDir()
	const n = 10
	codes := make([]int, n)
	stderrs := make([]string, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			cmd := exec.Command(bin, "--state-dir", st, "create", "same", "--backend", "qemu")
			cmd.Dir = repo
			var errb bytes.Buffer
			cmd.Stderr = &errb
			err := cmd.Run()
			codes[i] = cmd.ProcessState.ExitCode()
			if err != nil && codes[i] == -1 {
				t.Error(err)
			}
			stderrs[i] = errb.String()
		}(i)
	}
	wg.Wait()
	wins := 0
	for i, c := range codes {
		switch {
		case c == 0:
			wins++
		case c == 1 && strings.Contains(stderrs[i], "already exists"):
		default:
			t.Errorf("create %d: exit %d\n%s", i, c, stderrs[i])
		}
	}
	if wins != 1 {
		t.Errorf("%d creates succeeded, want exactly 1", wins)
	}
	assertNoDebris(t, st, []string{"same"})
}

// assertNoDebris checks that the state dir holds exactly the named VM dirs
// and no leftover staging or trash.
func assertNoDebris(t *testing.T, st string, want []string) {
	t.Helper()
	var got []string
	entries, _ := os.ReadDir(st)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			got = append(got, e.Name())
		}
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("VM dirs %v, want %v", got, want)
	}
	for _, d := range []string{".tmp", ".trash"} {
		des, _ := os.ReadDir(filepath.Join(st, d))
		if len(des) != 0 {
			var names []string
			for _, de := range des {
				names = append(names, de.Name())
			}
			t.Errorf("%s holds %v", d, names)
		}
	}
}

// A create killed while it clones leaves no VM: SIGINT is handled (exit 130,
// staging removed at once); after SIGKILL the next command sweeps the rest.
func TestKilledCreateLeavesNothing(t *testing.T) {
	tu.Need(t, runtime.GOOS == "linux", "linux only")
	bin := tu.AgentVMBinary(t)
	repo := tu.Repo(t, false)
	// A repository big enough that cloning it takes a moment.
	big := make([]byte, 64<<20)
	for i := range big {
		big[i] = byte(i*7 + i>>9)
	}
	os.WriteFile(filepath.Join(repo, "big.bin"), big, 0o644)
	tu.Git(t, repo, "add", "big.bin")
	tu.Git(t, repo, "commit", "--quiet", "-m", "big")
	for _, sig := range []os.Signal{os.Interrupt, os.Kill} {
		t.Run(sig.String(), func(t *testing.T) {
			st := t.TempDir()
			cmd := exec.Command(bin, "--state-dir", st, "create", "killed", "--backend", "qemu")
			cmd.Dir = repo
			pr, pw, _ := os.Pipe()
			cmd.Stderr = pw
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pw.Close()
			// Wait for the log line create prints right before cloning.
			buf := make([]byte, 4096)
			var seen string
			for !strings.Contains(seen, "cloning workspace") {
				n, err := pr.Read(buf)
				if err != nil {
					t.Fatalf("create ended before cloning: %s", seen)
				}
				seen += string(buf[:n])
			}
			cmd.Process.Signal(sig)
			cmd.Wait()
			code := cmd.ProcessState.ExitCode()
			if sig == os.Interrupt && code != 130 {
				t.Errorf("SIGINT: exit %d, want 130", code)
			}
			if _, err := os.Stat(filepath.Join(st, "killed")); !os.IsNotExist(err) {
				t.Fatalf("a killed create left its VM dir: %v", err)
			}
			// The next command (any) sweeps what a SIGKILL left in .tmp,
			// once no process holds the staging lock. The create is reaped,
			// but a git it was forking may hold a copy of the lock until its
			// exec (or its death, via Pdeathsig): wait for that, briefly.
			waitUnlocked(t, filepath.Join(st, ".tmp"))
			mustRun(t, "", st, "list")
			assertNoDebris(t, st, nil)
		})
	}
}

// waitUnlocked waits until no process holds a lock in dir.
func waitUnlocked(t *testing.T, dir string) {
	t.Helper()
	locks, _ := filepath.Glob(filepath.Join(dir, "*.lock"))
	for _, lp := range locks {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := tu.Poll(ctx, lp+" to be released after its create was killed", func() bool {
			l, ok, err := state.TryLock(lp)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				l.Release()
			}
			return ok
		})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestBashCompletionCompletesCommandsAndBranches(t *testing.T) {
	bash := tu.Program(t, "bash")
	bin := tu.AgentVMBinary(t)
	repo := tu.Repo(t, false)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "feature/complete-me", "--backend", "qemu")
	script := mustRun(t, "", st, "completion", "bash").stdout
	run := func(words ...string) string {
		t.Helper()
		prog := script + `
COMP_WORDS=(` + strings.Join(words, " ") + `)
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
_agent_vm_complete
printf '%s\n' "${COMPREPLY[@]}"
`
		cmd := exec.Command(bash, "-c", prog)
		cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("bash: %v\n%s", err, out)
		}
		return string(out)
	}
	if got := run("agent-vm", "--state-dir", st, "sta"); !strings.Contains(got, "start") || !strings.Contains(got, "status") {
		t.Errorf("completing 'sta': %q", got)
	}
	if got := run("agent-vm", "--state-dir", st, "status", "''"); !strings.Contains(got, "feature/complete-me") {
		t.Errorf("completing a branch: %q", got)
	}
}

func TestZshAndFishCompletionScriptsParse(t *testing.T) {
	st := t.TempDir()
	for shell, check := range map[string][]string{"zsh": {"zsh", "-n"}, "fish": {"fish", "--no-execute"}} {
		prog := tu.Program(t, check[0])
		script := mustRun(t, "", st, "completion", shell).stdout
		f := filepath.Join(t.TempDir(), "completion."+shell)
		os.WriteFile(f, []byte(script), 0o644)
		if out, err := exec.Command(prog, append(check[1:], f)...).CombinedOutput(); err != nil {
			t.Errorf("%s completion does not parse: %v\n%s", shell, err, out)
		}
	}
}

// TestVMsBelongToTheirRepository: two repositories each have a VM for
// "main"; names resolve within the repository a command runs in, and from
// outside any repository only when they name one VM.
func TestVMsBelongToTheirRepository(t *testing.T) {
	a, b := tu.Repo(t, false), tu.Repo(t, false)
	st := t.TempDir()
	mustRun(t, a, st, "create", "--backend", "qemu")
	r := mustRun(t, b, st, "create", "--backend", "qemu")
	if !strings.Contains(r.stdout, "created VM main-") {
		t.Errorf("the second repository's main VM should get a name of its own:\n%s", r.stdout)
	}
	slugIn := func(dir string, args ...string) string {
		t.Helper()
		var info map[string]any
		out := mustRun(t, dir, st, append([]string{"status", "--json"}, args...)...).stdout
		if err := json.Unmarshal([]byte(out), &info); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return info["slug"].(string)
	}
	bSlug := slugIn(b)
	if got := slugIn(a); got != "main" {
		t.Errorf("status in repository A: VM %q, want main", got)
	}
	if got := slugIn(a, "main"); got != "main" {
		t.Errorf("status main in repository A: VM %q, want main", got)
	}
	if got := slugIn(b, "main"); got != bSlug || bSlug == "main" {
		t.Errorf("status main in repository B: VM %q, want B's own (%s)", got, bSlug)
	}
	// A worktree of A is repository A.
	wt := filepath.Join(t.TempDir(), "wt")
	tu.Git(t, a, "worktree", "add", "--quiet", "-b", "side", wt)
	if got := slugIn(wt, "main"); got != "main" {
		t.Errorf("status main in a worktree of A: VM %q, want main", got)
	}
	// From outside any repository "main" names two VMs: refused, listing both.
	r = agentVM(t, "", st, "status", "main")
	if r.code != 1 || !strings.Contains(r.stderr, "more than one VM") || !strings.Contains(r.stderr, a) || !strings.Contains(r.stderr, b) {
		t.Errorf("ambiguous name outside a repository: exit %d\n%s", r.code, r.stderr)
	}
	if got := slugIn("", bSlug); got != bSlug {
		t.Errorf("status %s outside a repository: VM %q", bSlug, got)
	}
	// destroy with no BRANCH in B destroys B's VM, never A's.
	mustRun(t, b, st, "destroy")
	if got := slugIn(a); got != "main" {
		t.Errorf("A's VM after destroy in B: %q", got)
	}
	r = agentVM(t, b, st, "destroy", "main")
	if r.code != 1 || !strings.Contains(r.stderr, "other repositories") || !strings.Contains(r.stderr, a) {
		t.Errorf("destroy main in B once B has none: exit %d\n%s", r.code, r.stderr)
	}
	if got := slugIn(a); got != "main" {
		t.Errorf("A's VM after a refused destroy in B: %q", got)
	}
	// The VM's own workspace belongs to its repository.
	if got := slugIn(filepath.Join(st, "main", "workspace"), "main"); got != "main" {
		t.Errorf("status in A's VM workspace: VM %q", got)
	}
}

// TestRecordsWithoutARepositoryStillResolve: a record written before VMs
// had a repository gets it from the checkout it was created from.
func TestRecordsWithoutARepositoryStillResolve(t *testing.T) {
	a, b := tu.Repo(t, false), tu.Repo(t, false)
	st := t.TempDir()
	mustRun(t, a, st, "create", "--backend", "qemu")
	cfg := filepath.Join(st, "main", state.RecordFile)
	raw, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	delete(rec["git"].(map[string]any), "repo")
	raw, _ = json.Marshal(rec)
	if err := os.WriteFile(cfg, raw, 0o600); err != nil {
		t.Fatal(err)
	}

	r := agentVM(t, b, st, "status")
	if r.code != 1 || !strings.Contains(r.stderr, "other repositories") {
		t.Errorf("status in B of A's old-style VM: exit %d\n%s", r.code, r.stderr)
	}
	mustRun(t, b, st, "create", "--backend", "qemu")
	mustRun(t, a, st, "status", "main")
	saved, err := state.ReadRecord(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := filepath.EvalSymlinks(filepath.Join(a, ".git"))
	if saved.Git.Repo != want {
		t.Errorf("the old record's repository: saved %q, want %q", saved.Git.Repo, want)
	}
}

// create refuses what start would refuse, naming the whole --allow-origin
// value (a comma is part of it, not a separator), and leaves no VM behind.
func TestCreateRefusesOriginsStartWouldRefuse(t *testing.T) {
	repo := tu.Repo(t, true)
	st := t.TempDir()
	for _, origin := range []string{`https://a"b`, "https://$(id)", "https://*", "http://a,b", "https://claude.ai/"} {
		r := agentVM(t, repo, st, "create", "o", "--backend", "qemu", "--allow-origin", origin)
		if want := "--allow-origin " + strconv.Quote(origin); r.code == 0 || !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, "hint:") {
			t.Errorf("create --allow-origin %s: exit %d, want an error containing %s and a hint\n%s", origin, r.code, want, r.stderr)
		}
	}
	if r := mustRun(t, "", st, "list", "--json"); strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("refused creates left VMs:\n%s", r.stdout)
	}
	mustRun(t, repo, st, "create", "o", "--backend", "qemu", "--allow-origin", "http://[::1]:8080", "--allow-origin", "https://claude.ai")
	rec, err := state.ReadRecord(state.Layout{Dir: filepath.Join(st, "o")}.Record())
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"http://[::1]:8080", "https://claude.ai"}; !slices.Equal(rec.AllowOrigins, want) {
		t.Errorf("record's allow_origins %q, want %q", rec.AllowOrigins, want)
	}
}

// --disk is whole GiB, at least the documented 2G: nothing is rounded away.
func TestCreateRefusesDisksItCannotGive(t *testing.T) {
	repo := tu.Repo(t, true)
	st := t.TempDir()
	for disk, want := range map[string]string{
		"1500M":   `--disk "1500M" is not a whole number of GiB (hint: `,
		"1.5G":    `--disk "1.5G" is not a whole number of GiB (hint: `,
		"2.0001G": `--disk "2.0001G" is not a whole number of `,
		"1":       "--disk 1G is smaller than the 2G minimum (hint: ",
		"1G":      "--disk 1G is smaller than the 2G minimum (hint: ",
		"1024M":   "--disk 1G is smaller than the 2G minimum (hint: ",
	} {
		r := agentVM(t, repo, st, "create", "d", "--backend", "nixos", "--disk", disk)
		if r.code == 0 || !strings.Contains(r.stderr, want) {
			t.Errorf("create --disk %s: exit %d, want an error containing %q\n%s", disk, r.code, want, r.stderr)
		}
	}
	if r := mustRun(t, "", st, "list", "--json"); strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("refused creates left VMs:\n%s", r.stdout)
	}
}

// An explicitly empty flag value is a usage error naming the flag, not a
// silent default; an empty AGENT_VM_STATE_DIR is as good as unset.
func TestEmptyValuesAreRefusedNotDefaulted(t *testing.T) {
	repo := tu.Repo(t, true)
	st := t.TempDir()
	for _, c := range []struct{ args, want string }{
		{"--state-dir= list", "--state-dir is empty"},
		{"create --branch=", "--branch is empty"},
		{"create --branch ''", "--branch is empty"},
		{"--state-dir '' list", "--state-dir is empty"},
		{"create -b=", "--branch is empty"},
		{"create --repo= --branch x", "--repo is empty"},
		{"create --memory= --branch x", "--memory is empty"},
		{"create --backend= --branch x", "--backend is empty"},
	} {
		args := strings.Fields(c.args)
		for i, a := range args {
			if a == "''" {
				args[i] = ""
			}
		}
		r := agentVM(t, repo, st, args...)
		if r.code != cmdline.ExitUsage || !strings.Contains(r.stderr, c.want) || !strings.Contains(r.stderr, "hint:") {
			t.Errorf("agent-vm %s: exit %d, want %d and %q with a hint\n%s", c.args, r.code, cmdline.ExitUsage, c.want, r.stderr)
		}
	}
	if r := mustRun(t, "", st, "list", "--json"); strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("refused commands made VMs:\n%s", r.stdout)
	}

	home, fromEnv := t.TempDir(), t.TempDir()
	list := func(env map[string]string) string {
		var out, errb bytes.Buffer
		env["HOME"] = home
		code := Main(context.Background(), []string{"agent-vm", "list"},
			IO{In: os.Stdin, Out: &out, Err: &errb, Getenv: func(k string) string { return env[k] }})
		if code != 0 {
			t.Fatalf("list with %v: exit %d\n%s", env, code, errb.String())
		}
		return out.String()
	}
	if got := list(map[string]string{"AGENT_VM_STATE_DIR": fromEnv}); !strings.Contains(got, "no VMs in "+fromEnv) {
		t.Errorf("AGENT_VM_STATE_DIR=%s: list says %q", fromEnv, got)
	}
	if got, want := list(map[string]string{"AGENT_VM_STATE_DIR": ""}), filepath.Join(home, ".local", "share", "agent-vms"); !strings.Contains(got, "no VMs in "+want) {
		t.Errorf("AGENT_VM_STATE_DIR='': list says %q, want the default %s", got, want)
	}
}

// Every field docs/usage.md's "JSON output" table documents is in status --json
// and list --json (less mcp.token), even when empty: here a repository
// without a remote, so git.upstream_url is "".
func TestJSONHasEveryDocumentedField(t *testing.T) {
	readme, err := os.ReadFile("../../docs/usage.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(readme), "\n## JSON output\n")
	section, _, _ = strings.Cut(section, "\n## ")
	var fields []string
	for _, line := range strings.Split(section, "\n") {
		if cell, ok := strings.CutPrefix(line, "| `"); ok {
			cell, _, _ = strings.Cut("`"+cell, " |")
			for _, f := range strings.Split(cell, ",") {
				fields = append(fields, strings.Trim(strings.TrimSpace(f), "`"))
			}
		}
	}
	if len(fields) < 30 {
		t.Fatalf("found only %d fields in docs/usage.md's JSON output table: %q", len(fields), fields)
	}

	repo := tu.Repo(t, false)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "--backend", "qemu")
	var list []map[string]any
	if r := mustRun(t, "", st, "list", "--json"); json.Unmarshal([]byte(r.stdout), &list) != nil || len(list) != 1 {
		t.Fatalf("list --json:\n%s", r.stdout)
	}
	for name, obj := range map[string]map[string]any{"status": statusJSON(t, st, "main"), "list": list[0]} {
		for _, f := range fields {
			if name == "list" && f == "mcp.token" {
				continue
			}
			var v any = obj
			for _, key := range strings.Split(f, ".") {
				m, _ := v.(map[string]any)
				var ok bool
				if v, ok = m[key]; !ok {
					t.Errorf("%s --json lacks %s", name, f)
					break
				}
			}
		}
	}
}

// A long branch name is cut with an ellipsis in the list table (by terminal
// columns, so wide characters count double) and keeps every row's columns
// where they were; list --json has it whole.
func TestListTruncatesLongBranchesInTheTableOnly(t *testing.T) {
	repo := tu.Repo(t, false)
	st := t.TempDir()
	long, wide := "feature/"+strings.Repeat("very-long-name-", 8), "機能/"+strings.Repeat("長い名前", 10)
	for _, b := range []string{"x", long, wide} {
		mustRun(t, repo, st, "create", b, "--backend", "qemu")
	}
	r := mustRun(t, "", st, "list")
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("list:\n%s", r.stdout)
	}
	backendAt := func(line, word string) int {
		i := strings.Index(line, word)
		if i < 0 {
			t.Fatalf("no %q in %q", word, line)
		}
		return termsafe.Width(line[:i])
	}
	if repoCol := backendAt(lines[0], "REPO"); repoCol > maxBranchColumn+2 {
		t.Errorf("the BRANCH column is %d columns wide, more than %d:\n%s", repoCol-2, maxBranchColumn, r.stdout)
	}
	col := backendAt(lines[0], "BACKEND")
	for _, line := range lines[1:] {
		if got := backendAt(line, " qemu ") + 1; got != col {
			t.Errorf("BACKEND at column %d, want %d:\n%s", got, col, r.stdout)
		}
		if strings.Contains(line, long) || strings.Contains(line, wide) {
			t.Errorf("a long branch is shown whole:\n%s", line)
		}
	}
	if !strings.Contains(r.stdout, "feature/very-long-name-very-long-name-v…") || !strings.Contains(r.stdout, "機能/長い名前長い名前長い名前長い名前長…") {
		t.Errorf("long branches are not cut to %d columns with an ellipsis:\n%s", maxBranchColumn, r.stdout)
	}
	r = mustRun(t, "", st, "list", "--json")
	for _, b := range []string{long, wide} {
		if !strings.Contains(r.stdout, `"branch": "`+b+`"`) {
			t.Errorf("list --json lacks the whole branch %q", b)
		}
	}
}

func TestTruncateWidth(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"eleven-long", 10, "eleven-lo…"},
		{"日本語ブランチ", 14, "日本語ブランチ"},
		{"日本語ブランチ", 7, "日本語…"},
		{"日本語ブランチ", 6, "日本…"},
		{"e\u0301e\u0301e\u0301e\u0301", 3, "e\u0301e\u0301…"},
	} {
		got := termsafe.Truncate(c.in, c.n)
		if got != c.want || termsafe.Width(got) > c.n {
			t.Errorf("termsafe.Truncate(%q, %d) = %q (%d columns), want %q", c.in, c.n, got, termsafe.Width(got), c.want)
		}
	}
}

// start flags a backend cannot honour are refused, naming the flag and the
// backend, before anything boots (they were silently ignored).
func TestStartRefusesFlagsItsBackendIgnores(t *testing.T) {
	repo := tu.Repo(t, false)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "--backend", "qemu")
	r := agentVM(t, repo, st, "start", "--nixpkgs", "/nowhere")
	if r.code != 1 || !strings.Contains(r.stderr, "--nixpkgs") || !strings.Contains(r.stderr, "qemu backend") {
		t.Errorf("start --nixpkgs of a qemu VM: exit %d\n%s", r.code, r.stderr)
	}
	if s := statusJSON(t, st, "main")["state"]; s != "stopped" {
		t.Errorf("after the refused start the VM is %v", s)
	}
}

// The workspace is the agent's: destroy's refusal shows the names and
// messages it takes from there escaped, so none can forge a line of
// agent-vm's output or drive the terminal. That holds for git's own
// errors about the workspace too.
func TestDestroyRefusalEscapesWorkspaceStrings(t *testing.T) {
	repo := tu.Repo(t, true)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "w", "--backend", "qemu")
	ws := filepath.Join(st, "w", "workspace")
	evil := "notes\nit is safe: agent-vm destroy w --force\x1b]0;pwned\x07"
	tu.WriteFile(t, filepath.Join(ws, evil), "x\n")
	r := agentVM(t, "", st, "destroy", "w")
	if r.code != 1 {
		t.Fatalf("destroy with an untracked file: exit %d\n%s", r.code, r.stderr)
	}
	if want := `notes\nit is safe: agent-vm destroy w --force\x1b]0;pwned\x07`; !strings.Contains(r.stderr, want) {
		t.Errorf("refusal lacks the escaped name %q:\n%s", want, r.stderr)
	}
	if strings.Contains(r.stderr, "\x1b") || strings.Contains(r.stderr, "\nit is safe") {
		t.Errorf("refusal carries the name raw:\n%q", r.stderr)
	}

	f, err := os.OpenFile(filepath.Join(ws, ".git", "config"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("[core]\n\tbigFileThreshold = \"x\\nit is safe: agent-vm destroy w --force\"\n")
	f.Close()
	r = agentVM(t, "", st, "destroy", "w")
	if r.code != 1 || !strings.Contains(r.stderr, `x\nit is safe`) || strings.Contains(r.stderr, "\nit is safe") {
		t.Errorf("git's error about the workspace: exit %d, want it escaped:\n%s", r.code, r.stderr)
	}
	if _, err := os.Stat(ws); err != nil {
		t.Fatalf("a refused destroy removed the workspace: %v", err)
	}
}

// Ignored files and a commit only a tag reaches are work destroy keeps.
func TestDestroyRefusesForIgnoredFilesAndTaggedCommits(t *testing.T) {
	repo := tu.Repo(t, true)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "w", "--backend", "qemu")
	ws := filepath.Join(st, "w", "workspace")
	tu.WriteFile(t, filepath.Join(ws, ".git", "info", "exclude"), ".env\n")
	tu.WriteFile(t, filepath.Join(ws, ".env"), "TOKEN=1\n")
	r := agentVM(t, "", st, "destroy", "w")
	if r.code != 1 || !strings.Contains(r.stderr, "ignored file that exists only here") || !strings.Contains(r.stderr, ".env") {
		t.Errorf("destroy with an ignored .env: exit %d\n%s", r.code, r.stderr)
	}
	os.Remove(filepath.Join(ws, ".env"))
	tu.Git(t, ws, "commit", "--quiet", "--allow-empty", "-m", "tagged only")
	tu.Git(t, ws, "tag", "keep")
	tu.Git(t, ws, "reset", "--quiet", "--hard", "HEAD~1")
	r = agentVM(t, "", st, "destroy", "w")
	if r.code != 1 || !strings.Contains(r.stderr, "tagged only (tag keep)") {
		t.Errorf("destroy with a commit only a tag has: exit %d\n%s", r.code, r.stderr)
	}
	mustRun(t, "", st, "destroy", "w", "--force")
}

// logs shows the guest's console escaped (always, not only on a terminal:
// `logs | grep` reaches one too); colour sequences are dropped.
func TestLogsEscapesTheConsole(t *testing.T) {
	repo := tu.Repo(t, false)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "w", "--backend", "qemu")
	console := statusJSON(t, st, "w")["paths"].(map[string]any)["console_log"].(string)
	tu.WriteFile(t, console, "[  \x1b[0;32mOK\x1b[0m  ] Started x.\r\nevil \x1b]0;pwned\x07 \u202eline\r\n")
	r := mustRun(t, "", st, "logs", "w")
	for _, want := range []string{"[  OK  ] Started x.\n", `evil \x1b]0;pwned\x07 \u202eline` + "\n", "the VM is not running"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("logs lack %q:\n%s", want, r.stdout)
		}
	}
	if strings.ContainsAny(r.stdout, "\x1b\x07\r\u202e") {
		t.Errorf("logs carry control characters raw: %q", r.stdout)
	}
}

// Sizes are checked against the host that will run them (measured before:
// --memory 5T was accepted on a 24 GiB host and recorded as 5120 GiB).
func TestCreateRefusesMoreThanTheHostHas(t *testing.T) {
	repo := tu.Repo(t, false)
	st := t.TempDir()
	threads := runtime.NumCPU()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--memory", "5T"}, []string{"--memory 5 TiB", "this host's", "of RAM", "--overcommit"}},
		{[]string{"--cpus", strconv.Itoa(threads + 1)}, []string{fmt.Sprintf("this host's %d CPU threads", threads), "--overcommit"}},
	} {
		r := agentVM(t, repo, st, append([]string{"create", "--backend", "qemu"}, c.args...)...)
		for _, w := range c.want {
			if r.code != 1 || !strings.Contains(r.stderr, w) {
				t.Errorf("create %v: exit %d, want 1 and %q in\n%s", c.args, r.code, w, r.stderr)
			}
		}
	}
	if entries, _ := os.ReadDir(st); len(entries) > 3 { // .locks .tmp .trash
		t.Errorf("refused creates left %v", entries)
	}
	mustRun(t, repo, st, "create", "--backend", "qemu", "--memory", "5T", "--cpus", strconv.Itoa(threads+1), "--overcommit")
	if res := statusJSON(t, st, "main")["resources"].(map[string]any); res["memory_mib"] != float64(5<<20) {
		t.Errorf("--overcommit --memory 5T recorded %v", res)
	}
}

// doctor's verdict names the backend that can run VMs, and another one
// that could when the default cannot.
func TestDoctorVerdictNamesTheBackend(t *testing.T) {
	for _, c := range []struct {
		r    hostsetup.DoctorReport
		want string
	}{
		{hostsetup.DoctorReport{Accel: "tcg", Backend: "nixos", Backends: []string{"nixos"}, VMReady: true}, "this host can run VMs (tcg) with the nixos backend\n"},
		{hostsetup.DoctorReport{Accel: "kvm", Backend: "qemu", Backends: []string{"nixos", "qemu"}, VMReady: true}, "this host can run VMs (kvm) with the qemu backend, and with --backend nixos\n"},
		{hostsetup.DoctorReport{Accel: "tcg", Backend: "qemu", Backends: []string{"nixos"}}, "cannot run VMs with the qemu backend yet (see the hints above), but can with --backend nixos\n"},
		{hostsetup.DoctorReport{Accel: "tcg", Backend: "qemu", Backends: []string{}}, "this host cannot run VMs yet: see the hints above\n"},
	} {
		var out bytes.Buffer
		printDoctor(IO{Out: &out}, c.r)
		if !strings.HasSuffix(out.String(), c.want) {
			t.Errorf("%+v: got %q, want it to end %q", c.r, out.String(), c.want)
		}
	}
}

// The browser's section follows the verdict, in the table's style, and
// says which way run --chrome would take.
func TestDoctorPrintsTheBrowser(t *testing.T) {
	r := hostsetup.DoctorReport{Accel: "kvm", Backend: "qemu", Backends: []string{"qemu"}, VMReady: true,
		Browser: hostsetup.BrowserReport{Chrome: "DevTools (host Chrome at 127.0.0.1:9222)", Checks: []hostsetup.Check{
			{Name: "claude in chrome bridge", Detail: "no Claude in Chrome bridge socket in /tmp/x"},
			{Name: "devtools 127.0.0.1:9222", OK: true, Detail: "Chrome/141 answers"}}}}
	var out bytes.Buffer
	printDoctor(IO{Out: &out}, r)
	want := "this host can run VMs (kvm) with the qemu backend\n\nbrowser (run --chrome, agent-vm browser)\n" +
		"--  claude in chrome bridge    no Claude in Chrome bridge socket in /tmp/x\n" +
		"ok  devtools 127.0.0.1:9222    Chrome/141 answers\n" +
		"run --chrome would use: DevTools (host Chrome at 127.0.0.1:9222)\n"
	if !strings.HasSuffix(out.String(), want) {
		t.Errorf("got %q, want it to end %q", out.String(), want)
	}
}

// --agent takes the agents agent-vm knows; the nixos backend cannot install
// them yet and says so; status reports the choice.
func TestCreateAgent(t *testing.T) {
	repo := tu.Repo(t, false)
	st := t.TempDir()
	r := agentVM(t, repo, st, "create", "--backend", "qemu", "--agent", "clippy")
	if r.code != 1 || !strings.Contains(r.stderr, `--agent "clippy"`) || !strings.Contains(r.stderr, "claude, codex, gemini") {
		t.Errorf("unknown agent: exit %d\n%s", r.code, r.stderr)
	}
	r = agentVM(t, repo, st, "create", "--backend", "nixos", "--agent", "claude")
	if r.code != 1 || !strings.Contains(r.stderr, "nixos backend cannot install agent CLIs") {
		t.Errorf("--agent on nixos: exit %d\n%s", r.code, r.stderr)
	}
	mustRun(t, repo, st, "create", "--backend", "qemu", "--agent", "codex")
	if got := statusJSON(t, st, "main")["agent_cli"]; got != "codex" {
		t.Errorf("status agent_cli %v, want codex", got)
	}
}
