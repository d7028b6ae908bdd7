package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/agent-vm/agent-vm/internal/state"
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

// agentVM runs the CLI in process, in dir, with the state dir given.
func agentVM(t *testing.T, dir, stateDir string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	wd, _ := os.Getwd()
	if dir != "" {
		if err := os.Chdir(dir); err != nil {
			t.Fatal(err)
		}
		defer os.Chdir(wd)
	}
	env := map[string]string{"HOME": os.Getenv("HOME"), "NO_COLOR": "1"}
	code := Main(context.Background(), append([]string{"agent-vm", "--state-dir", stateDir}, args...),
		IO{In: os.Stdin, Out: &out, Err: &errb, Getenv: func(k string) string { return env[k] }})
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
	r := mustRun(t, repo, st, "create", "--branch", "feature/x", "--backend", "qemu", "--memory", "1G", "--cpus", "1")
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
	mustRun(t, repo, st, "create", "--branch", "k", "--backend", "qemu")
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
	mustRun(t, repo, st, "create", "--branch", "feature/x", "--backend", "qemu")
	r := agentVM(t, repo, st, "create", "--branch", "feature-x", "--backend", "qemu")
	if r.code != 1 || !strings.Contains(r.stderr, `"feature/x"`) || !strings.Contains(r.stderr, "already uses") {
		t.Errorf("colliding branch: exit %d\n%s", r.code, r.stderr)
	}
	r = agentVM(t, repo, st, "create", "--branch", "feature/x", "--backend", "qemu")
	if r.code != 1 || !strings.Contains(r.stderr, "already exists") {
		t.Errorf("duplicate: exit %d\n%s", r.code, r.stderr)
	}
	r = agentVM(t, repo, st, "create", "--branch", "bad..name", "--backend", "qemu")
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
		mustRun(t, repo, st, "create", "--branch", branch, "--backend", "qemu")
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
	mustRun(t, repo, st, "create", "--branch", "pinned", "--backend", "qemu", "--port", "8600")
	if p := statusJSON(t, st, "pinned")["ports"].(map[string]any); p["mcp"] != 8600.0 {
		t.Errorf("--port 8600 gave %v", p["mcp"])
	}
	r := agentVM(t, repo, st, "create", "--branch", "pinned2", "--backend", "qemu", "--port", "8600")
	if r.code != 1 || !strings.Contains(r.stderr, "8600") {
		t.Errorf("a taken --port: exit %d\n%s", r.code, r.stderr)
	}
}

func TestDestroyRefusesUnsavedWorkAndForceOverrides(t *testing.T) {
	repo := tu.Repo(t, true)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "--branch", "w", "--backend", "qemu")
	ws := filepath.Join(st, "w", "workspace")
	tu.WriteFile(t, filepath.Join(ws, "agent.txt"), "work\n")
	tu.Git(t, ws, "add", ".")
	tu.Git(t, ws, "commit", "--quiet", "-m", "agent's work")
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
	mustRun(t, repo, st, "create", "--branch", "good", "--backend", "qemu")
	mustRun(t, repo, st, "create", "--branch", "broken", "--backend", "qemu")
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
		{[]string{"--log-format", "xml", "list"}, 2, "text or json"},
		{[]string{"completion", "tcsh"}, 2, "bash, zsh or fish"},
		{[]string{"exec", "x"}, 2, "exec needs a command"},
		{[]string{"version"}, 0, ""},
	}
	for _, c := range cases {
		r := agentVM(t, t.TempDir(), st, c.args...)
		if r.code != c.code || !strings.Contains(r.stderr+r.stdout, c.want) {
			t.Errorf("agent-vm %v: exit %d (want %d)\n%s%s", c.args, r.code, c.code, r.stdout, r.stderr)
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
			cmd := exec.Command(bin, "--state-dir", st, "create", "--branch", "same", "--backend", "qemu")
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
	if runtime.GOOS != "linux" {
		t.Skip("linux only")
	}
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
			cmd := exec.Command(bin, "--state-dir", st, "create", "--branch", "killed", "--backend", "qemu")
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
		deadline := time.Now().Add(10 * time.Second)
		for {
			l, ok, err := state.TryLock(lp)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				l.Release()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s is still held 10s after its create was killed", lp)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func TestBashCompletionCompletesCommandsAndBranches(t *testing.T) {
	bash := tu.Program(t, "bash")
	bin := tu.AgentVMBinary(t)
	repo := tu.Repo(t, false)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "--branch", "feature/complete-me", "--backend", "qemu")
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

// The workspace is the agent's: destroy's refusal shows the names and
// messages it takes from there escaped, so none can forge a line of
// agent-vm's output or drive the terminal. That holds for git's own
// errors about the workspace too.
func TestDestroyRefusalEscapesWorkspaceStrings(t *testing.T) {
	repo := tu.Repo(t, true)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "--branch", "w", "--backend", "qemu")
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
	mustRun(t, repo, st, "create", "--branch", "w", "--backend", "qemu")
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
	mustRun(t, repo, st, "create", "--branch", "w", "--backend", "qemu")
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
