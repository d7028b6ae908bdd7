package logtail

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// A stand-in for the SSH command runner vm gives Show (the boundary: a
// command in the guest): it records the commands and answers each with
// canned output, written in two pieces as stdout and stderr may be.
type guestRec struct {
	mu   sync.Mutex
	cmds []string
}

func (g *guestRec) run(ctx context.Context, cmd string, w io.Writer) error {
	g.mu.Lock()
	g.cmds = append(g.cmds, cmd)
	g.mu.Unlock()
	src := "journal"
	if strings.Contains(cmd, "provision") {
		src = "provision"
	}
	fmt.Fprintf(w, "%s line \x1b[31mred", src)
	fmt.Fprintf(w, "\x1b[0m\n")
	if strings.Contains(cmd, " -f") || strings.Contains(cmd, " -F") {
		<-ctx.Done()
	}
	return nil
}

func console(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "console.log")
	if err := os.WriteFile(p, []byte("boot 1\nevil \x1b]0;title\x07\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Without follow: each log under its header, every line escaped; a VM
// that does not run shows its console only and says so.
func TestShow(t *testing.T) {
	p := console(t)
	g := &guestRec{}
	var out strings.Builder
	if err := Show(context.Background(), Sources{Console: p, Guest: g.run}, 5, false, &out); err != nil {
		t.Fatal(err)
	}
	want := "==> serial console (" + p + ") <==\nboot 1\nevil \\x1b]0;title\\x07\n" +
		"==> provisioning log (/var/log/agent-vm-provision.log) <==\nprovision line red\n" +
		"==> agent-mcp journal <==\njournal line red\n"
	if out.String() != want {
		t.Errorf("got\n%q\nwant\n%q", out.String(), want)
	}
	if len(g.cmds) != 2 || !strings.Contains(g.cmds[0], "tail -n 5 ") || !strings.Contains(g.cmds[1], "journalctl -u agent-mcp") || !strings.Contains(g.cmds[1], "-n 5") {
		t.Errorf("guest commands %q; want the provisioning log's and the journal's last 5 lines", g.cmds)
	}

	out.Reset()
	if err := Show(context.Background(), Sources{Console: p}, 0, false, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(out.String(), "==> agent-mcp journal: the VM is not running <==\n") || !strings.Contains(out.String(), "boot 1") {
		t.Errorf("a stopped VM's logs: %q", out.String())
	}
}

// With follow: every source's lines prefixed with its name, until ctx
// ends, which is no error.
func TestShowFollows(t *testing.T) {
	p := console(t)
	g := &guestRec{}
	ctx, cancel := context.WithCancel(context.Background())
	out := &tu.SyncBuffer{}
	done := make(chan error, 1)
	go func() { done <- Show(ctx, Sources{Console: p, Guest: g.run}, 10, true, out) }()
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := tu.Poll(wctx, "a line of each source", func() bool {
		return strings.Contains(out.String(), "agent-mcp | journal line red") && strings.Contains(out.String(), "provision | provision line red") &&
			strings.Contains(out.String(), "console   | boot 1")
	}); err != nil {
		t.Fatalf("%v: %q", err, out.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Show after ctx ended: %v", err)
	}
	if !strings.Contains(out.String(), `console   | evil \x1b]0;title\x07`) {
		t.Errorf("the console's control characters not escaped: %q", out.String())
	}
}
