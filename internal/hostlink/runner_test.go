package hostlink

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/proc"
	"github.com/agent-vm/agent-vm/internal/sshx/sshdtest"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// Programs run on the host over the link (the real sshd here): argv
// arrives as given (spaces, quotes), with env and dir; stdin reaches the
// program; a non-zero exit is an *execx.Error carrying the code and the
// remote stderr and naming the host; LookPath answers with the host's
// path or an error.
func TestRunnerOverTheLink(t *testing.T) {
	srv := sshdtest.New(t)
	srv.Start()
	c, err := Dial(context.Background(), Target{Addr: srv.Addr, User: srv.User, KeyFile: srv.KeyFile, KnownHosts: srv.KnownHosts})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := Runner{C: c}
	ctx := context.Background()
	dir := t.TempDir()
	res, err := r.Run(ctx, execx.Cmd{Path: "sh", Args: []string{"-c", `pwd; printf '%s|' "$@"; echo "$GREETING"`, "sh", "a b", "it's", "$HOME"},
		Dir: dir, Env: []string{"GREETING=hello there"}})
	if want := dir + "\na b|it's|$HOME|hello there\n"; err != nil || string(res.Stdout) != want {
		t.Errorf("argv, env and dir: %q, %v; want %q", res.Stdout, err, want)
	}
	res, err = r.Run(ctx, execx.Cmd{Path: "sh", Args: []string{"-c", "cat"}, Stdin: strings.NewReader("from stdin")})
	if err != nil || string(res.Stdout) != "from stdin" {
		t.Errorf("stdin: %q, %v", res.Stdout, err)
	}
	_, err = r.Run(ctx, execx.Cmd{Path: "sh", Args: []string{"-c", "echo broken >&2; exit 3"}})
	var ee *execx.Error
	if !errors.As(err, &ee) || ee.ExitCode != 3 || ee.Stderr != "broken" || !strings.Contains(err.Error(), "(on "+srv.Addr+")") {
		t.Errorf("a failing program: %v", err)
	}
	if p, err := r.LookPath("sh"); err != nil || !strings.HasSuffix(p, "/sh") {
		t.Errorf("LookPath sh: %q %v", p, err)
	}
	// A name no host has (looked up, never run: not a host program).
	missing := "agent-vm-no-such-program"
	if _, err := r.LookPath(missing); err == nil {
		t.Error("LookPath found a program that is not there")
	}
	if _, err := r.Start(execx.Detached{Path: "sleep"}); err == nil {
		t.Error("Start over the link did not refuse")
	}
}

// A detached program started over the link by agent-vm's binary on the
// host (here this machine, through its real sshd): it gets its standard
// input, outlives the SSH session in a session of its own, and its pid
// comes back; a spec that names no program is refused as a usage error.
func TestStartOverTheLink(t *testing.T) {
	srv := sshdtest.New(t)
	srv.Start()
	c, err := Dial(context.Background(), Target{Addr: srv.Addr, User: srv.User, KeyFile: srv.KeyFile, KnownHosts: srv.KnownHosts})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := Runner{C: c, Agent: tu.AgentVMBinary(t)}
	dir := t.TempDir()
	out := filepath.Join(dir, "got")
	p, err := r.Start(execx.Detached{Path: "sh", Args: []string{"-c", `cat > "$0"; exec sleep 60`, out}, StdoutPath: filepath.Join(dir, "log"), Stdin: []byte("the secret")})
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(p.Pid(), syscall.SIGKILL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b []byte
	if err := tu.Poll(ctx, "the detached program to copy its stdin", func() bool { b, _ = os.ReadFile(out); return string(b) == "the secret" }); err != nil {
		t.Fatalf("%v: the detached program's stdin: %q", err, b)
	}
	if err := syscall.Kill(p.Pid(), 0); err != nil {
		t.Fatalf("pid %d is not running: %v", p.Pid(), err)
	}
	if s := proc.Session(p.Pid()); s != p.Pid() {
		t.Errorf("the detached program is in session %d, not one of its own", s)
	}
	_, err = r.Run(context.Background(), execx.Cmd{Path: r.Agent, Args: []string{DetachCommand}, Stdin: strings.NewReader("{}")})
	var ee *execx.Error
	if !errors.As(err, &ee) || ee.ExitCode != 2 || !strings.Contains(ee.Stderr, "not a program to start") {
		t.Errorf("an empty spec: %v", err)
	}
}
