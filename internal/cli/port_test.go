package cli

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// busyPort holds a port on 127.0.0.1 for the test's duration.
func busyPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

type listed struct{ Guest, Host int }

func portList(t *testing.T, st, vm string) []listed {
	t.Helper()
	r := mustRun(t, "", st, "port", "list", vm, "--json")
	var fwds []listed
	if err := json.Unmarshal([]byte(r.stdout), &fwds); err != nil {
		t.Fatalf("port list --json: %v\n%s", err, r.stdout)
	}
	return fwds
}

// On a stopped VM, port add records the forward (and says it applies at the
// next start); list, status and ssh-config show it; rm removes it.
func TestPortAddListRemoveOnAStoppedVM(t *testing.T) {
	repo := tu.Repo(t, false)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "--backend", "qemu")
	if fwds := portList(t, st, "main"); len(fwds) != 0 {
		t.Fatalf("a new VM has forwards: %v", fwds)
	}
	if r := mustRun(t, "", st, "port", "list", "main"); !strings.Contains(r.stdout, "no port forwards") {
		t.Errorf("port list of a VM without forwards:\n%s", r.stdout)
	}

	// The same number when it is free.
	guest := tu.FreePort(t)
	r := mustRun(t, "", st, "port", "add", "--vm", "main", strconv.Itoa(guest))
	if want := fmt.Sprintf("guest port %d of main will be forwarded to 127.0.0.1:%d: the VM is not running, so the forward applies at its next start", guest, guest); !strings.Contains(r.stdout, want) {
		t.Errorf("port add on a stopped VM says:\n%s\nwant %q", r.stdout, want)
	}
	// Again: nothing changes, and it says so.
	r = mustRun(t, "", st, "port", "add", "--vm", "main", strconv.Itoa(guest))
	if !strings.Contains(r.stdout, "already forwarded") || len(portList(t, st, "main")) != 1 {
		t.Errorf("a second identical add:\n%s\nforwards %v", r.stdout, portList(t, st, "main"))
	}
	r = mustRun(t, "", st, "port", "add", "--vm", "main", strconv.Itoa(guest), strconv.Itoa(guest))
	if !strings.Contains(r.stdout, "already forwarded") {
		t.Errorf("an identical add with the host port:\n%s", r.stdout)
	}

	// The guest port's own number is the VM's SSH port on the host: it
	// gets a free port of the range instead.
	s := statusJSON(t, st, "main")
	sshPort := int(s["ports"].(map[string]any)["ssh"].(float64))
	mustRun(t, "", st, "port", "add", "--vm", "main", strconv.Itoa(sshPort))
	fwds := portList(t, st, "main")
	want0 := listed{guest, guest}
	if len(fwds) != 2 || fwds[0] != want0 || fwds[1].Guest != sshPort || fwds[1].Host < 8000 || fwds[1].Host > 8999 {
		t.Fatalf("forwards %v, want %v and guest %d on a port of 8000-8999", fwds, want0, sshPort)
	}

	// status (text and JSON) and ssh-config show them; ssh-config as
	// comments, never LocalForward (QEMU binds those ports).
	s = statusJSON(t, st, "main")
	if got := fmt.Sprint(s["forwards"]); !strings.Contains(got, fmt.Sprintf("guest:%d host:%d", guest, guest)) {
		t.Errorf("status --json forwards: %s", got)
	}
	if r := mustRun(t, "", st, "status", "main"); !strings.Contains(r.stdout, fmt.Sprintf("forwards:   guest %d -> 127.0.0.1:%d, guest %d -> 127.0.0.1:%d", guest, guest, sshPort, fwds[1].Host)) {
		t.Errorf("status:\n%s", r.stdout)
	}
	r = mustRun(t, "", st, "ssh-config", "main")
	if strings.Contains(r.stdout, "LocalForward") || !strings.Contains(r.stdout, fmt.Sprintf("  # guest port %d: on 127.0.0.1:%d while the VM runs, forwarded by QEMU", guest, guest)) {
		t.Errorf("ssh-config:\n%s", r.stdout)
	}
	if r := mustRun(t, "", st, "port", "list", "main"); !strings.Contains(r.stdout, fmt.Sprintf("127.0.0.1:%d", guest)) || !strings.Contains(r.stdout, "at the next start") {
		t.Errorf("port list:\n%s", r.stdout)
	}

	// Another VM cannot take a host port this one's forward holds.
	mustRun(t, repo, st, "create", "--backend", "qemu", "--branch", "other")
	r = agentVM(t, "", st, "port", "add", "--vm", "other", "4000", strconv.Itoa(guest))
	if r.code != 1 || !strings.Contains(r.stderr, fmt.Sprintf(`port %d is already used by the VM of branch "main" (its forward of guest port %d)`, guest, guest)) {
		t.Errorf("a host port another VM's forward holds: exit %d\n%s", r.code, r.stderr)
	}

	r = mustRun(t, "", st, "port", "rm", "--vm", "main", strconv.Itoa(guest))
	if !strings.Contains(r.stdout, fmt.Sprintf("guest port %d of main is no longer forwarded", guest)) {
		t.Errorf("port rm:\n%s", r.stdout)
	}
	if fwds := portList(t, st, "main"); len(fwds) != 1 || fwds[0].Guest != sshPort {
		t.Errorf("after rm: %v", fwds)
	}
}

// Every way port can be refused, each with its exit code and a message
// that says what to do.
func TestPortRefusals(t *testing.T) {
	repo := tu.Repo(t, false)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "--backend", "qemu")
	mustRun(t, "", st, "port", "add", "--vm", "main", "3000", "38999")
	busy := busyPort(t)
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"port", "add", "--vm", "main"}, 2, "port add takes GUEST_PORT [HOST_PORT], got 0 arguments"},
		{[]string{"port", "add", "--vm", "main", "1", "2", "3"}, 2, "got 3 arguments"},
		{[]string{"port", "add", "--vm", "main", "http"}, 2, `GUEST_PORT "http" is not a port number`},
		{[]string{"port", "add", "--vm", "main", "3001", "x"}, 2, `HOST_PORT "x" is not a port number`},
		{[]string{"port", "rm", "--vm", "main"}, 2, "port rm takes GUEST_PORT"},
		{[]string{"port", "list"}, 2, "is not in a git checkout (hint: agent-vm port list BRANCH"},
		{[]string{"port", "add", "3000"}, 2, "is not in a git checkout (hint: agent-vm port add --vm BRANCH"},
		{[]string{"port", "add", "--vm", "main", "0"}, 1, "GUEST_PORT 0 is not a port number (hint: use 1 to 65535)"},
		{[]string{"port", "add", "--vm", "main", "65536"}, 1, "GUEST_PORT 65536 is not a port number"},
		{[]string{"port", "add", "--vm", "main", "3001", "70000"}, 1, "HOST_PORT 70000 is not a port number"},
		{[]string{"port", "add", "--vm", "main", "3001", "80"}, 1, "port 80 is out of range (hint: use a port between 1024 and 65535)"},
		{[]string{"port", "add", "--vm", "main", "22"}, 1, "guest port 22 is SSH's, which \"main\" forwards already"},
		{[]string{"port", "add", "--vm", "main", "8000"}, 1, "guest port 8000 is agent-mcp's, which \"main\" forwards already"},
		{[]string{"port", "rm", "--vm", "main", "22"}, 1, "guest port 22 is SSH's"},
		{[]string{"port", "add", "--vm", "main", "3000", "39000"}, 1, "guest port 3000 of \"main\" is already forwarded to host port 38999 (hint: `agent-vm port rm --vm main 3000` first"},
		{[]string{"port", "add", "--vm", "main", "3001", strconv.Itoa(busy)}, 1, fmt.Sprintf("port %d is already in use on 127.0.0.1 by another program (hint: stop it, or choose another HOST_PORT)", busy)},
		{[]string{"port", "add", "--vm", "main", "3001", "38999"}, 1, `port 38999 is already used by the VM of branch "main" (its forward of guest port 3000) (hint: choose another HOST_PORT`},
		{[]string{"port", "rm", "--vm", "main", "3001"}, 1, "\"main\" has no forward of guest port 3001 (hint: `agent-vm port list main` shows its forwards)"},
		{[]string{"port", "add", "--vm", "nope", "3001"}, 1, "agent-vm list"},
		{[]string{"port", "rm", "--vm", "nope", "3000"}, 1, "agent-vm list"},
		{[]string{"port", "list", "nope"}, 1, "agent-vm list"},
	}
	for _, c := range cases {
		r := agentVM(t, "", st, c.args...)
		if r.code != c.code || !strings.Contains(r.stderr, c.want) {
			t.Errorf("agent-vm %v: exit %d (want %d and %q)\n%s%s", c.args, r.code, c.code, c.want, r.stdout, r.stderr)
		}
	}
	// None of that changed the record.
	if fwds := portList(t, st, "main"); len(fwds) != 1 || fwds[0] != (listed{3000, 38999}) {
		t.Errorf("forwards after the refusals: %v", fwds)
	}
	// A guest port whose own number is busy on the host gets another.
	mustRun(t, "", st, "port", "add", "--vm", "main", strconv.Itoa(busy))
	if fwds := portList(t, st, "main"); len(fwds) != 2 || fwds[1].Guest != busy || fwds[1].Host == busy {
		t.Errorf("guest port %d, busy on the host: forwards %v", busy, fwds)
	}
}
