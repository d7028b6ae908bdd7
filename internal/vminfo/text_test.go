package vminfo

import (
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/guestctl"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/state"
)

// What status prints for people: each line with its next command, the
// state with how a suspended VM keeps its memory, the guest's words made
// safe for a terminal, and the short forms of an invalid record's and a
// foreign guest's.
func TestWriteText(t *testing.T) {
	started := time.Date(2026, 11, 30, 7, 0, 0, 0, time.UTC)
	running := Info{Branch: "feat/x", Slug: "feat-x", Backend: "qemu", State: StateRunning, Pid: 4242, StartedAt: &started, UptimeSeconds: 90,
		Accel: "tcg", AccelReason: "/dev/kvm does not exist", Share: "virtiofs", ShareCache: "auto",
		Agent: guestctl.Health{State: "healthy", Detail: "ok \x1b[31mred"},
		SSH:   SSHInfo{Port: 2222, User: "dev", Alias: "agent-vm-feat-x"}, MCP: MCPInfo{URL: "http://127.0.0.1:8000/mcp", Health: "http://127.0.0.1:8000/health", Token: "tok"},
		Forwards: []state.Forward{{Guest: 3000, Host: 3001}},
		Net:      &netpolicy.Info{Mode: egress.ModeAsk, Added: []string{"example.com"}, Pending: 2, Exposed: []state.Exposed{{Port: 5432}}},
		Secrets:  []string{"GITHUB_TOKEN"}, Paths: PathsInfo{Workspace: "/s/feat-x/workspace"}, Git: state.Git{Source: "/home/u/repo"},
		Resources: state.Resources{CPUs: 2, MemoryMiB: 4096, DiskGiB: 20}, CreatedAt: started}
	var b strings.Builder
	running.WriteText(&b)
	for _, want := range []string{
		"branch:     feat/x\n",
		"vm:         feat-x (backend qemu)\n",
		"state:      running, pid 4242, up 1m30s\n",
		"accel:      tcg (/dev/kvm does not exist), workspace over virtiofs (cache auto)\n",
		"agent:      healthy (ok \\x1b[31mred)\n",
		"ssh:        agent-vm shell feat-x, or ssh agent-vm-feat-x after `agent-vm ssh-config >> ~/.ssh/config` (127.0.0.1:2222, user dev)\n",
		"token:      tok (`agent-vm mcp-config feat-x` prints a client entry)\n",
		"forwards:   guest 3000 -> 127.0.0.1:3001\n",
		"network:    allow-list (the default and example.com), other names asked about (2 pending); host ports exposed: 5432 (`agent-vm net show feat-x`)\n",
		"secrets:    GITHUB_TOKEN (placeholders in the guest; the egress proxy adds the values)\n",
		"resources:  2 CPUs, 4 GiB memory, 20 GiB disk\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}

	hib := Info{Branch: "b", Slug: "b", Backend: "qemu", State: StateSuspended, Suspend: SuspendHibernated, Pid: 7, Detail: "hibernated since T"}
	b.Reset()
	hib.WriteText(&b)
	if !strings.Contains(b.String(), "state:      suspended (hibernated), pid 7 (hibernated since T)\n") || !strings.Contains(b.String(), "forwards:   none (agent-vm port add --vm b PORT forwards a guest port)\n") {
		t.Errorf("a hibernated VM's status:\n%s", b.String())
	}
	if got := hib.StateText(); got != "suspended (hibernated)" {
		t.Errorf("StateText %q", got)
	}

	b.Reset()
	Info{Slug: "broken", State: StateInvalid, Error: "config.json: no record version"}.WriteText(&b)
	if b.String() != "vm:         broken\nstate:      invalid\nreason:     config.json: no record version\n" {
		t.Errorf("an invalid record's status:\n%q", b.String())
	}

	b.Reset()
	Info{Branch: "vf", Slug: "vf", Backend: "vagrant", State: StateStopped, Foreign: "the repository's Vagrantfile", SSH: SSHInfo{Alias: "agent-vm-vf"}}.WriteText(&b)
	for _, want := range []string{"vagrantfile: the repository's own", "mcp:        none (the repository's Vagrantfile runs no agent-mcp)", "resources:  as the Vagrantfile says"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("a foreign guest's status lacks %q:\n%s", want, b.String())
		}
	}
}
