// Package mcpsync gives a VM's Claude Code the MCP servers the host's
// Claude Code has: `agent-vm mcp sync`, and `agent-vm run` before an agent
// session starts. internal/mcpconfig reads the host's configuration and
// converts it (pure); this package reads and replaces the guest's file over
// SSH, asks the VM's agent-mcp which servers it serves, and records in the
// VM's record the host ports the guest now reaches (rewriting the network
// policy, internal/netpolicy) and the servers it wrote.
//
// It knows no vm: it reaches the VM through VMs, the small interface of
// vm's Manager it needs (cli wires it in).
package mcpsync

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/mcpconfig"
	"github.com/agent-vm/agent-vm/internal/mcpproxy"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
)

// VMs is what a sync needs of agent-vm's VMs; vm's Manager has it.
type VMs interface {
	// PinSource gives the host's pins, which the policy written here
	// carries.
	netpolicy.PinSource
	// Find finds the VM name means (a branch or a VM name); its Record
	// is nil, and Err says why, when its record is unreadable.
	Find(ctx context.Context, name string) (state.Entry, error)
	// State is the VM's state as status shows it (driver.StateRunning ...).
	State(ctx context.Context, e state.Entry) string
	// Connect opens an SSH connection to the running VM name means.
	Connect(ctx context.Context, name string) (*ssh.Client, string, error)
	// LockVM takes the lock of the VM called slug; the caller releases it.
	LockVM(ctx context.Context, slug string) (*state.Lock, error)
	// GuestPrograms are the programs an MCP server may run in a guest of
	// the backend named.
	GuestPrograms(backend string) []string
}

// Options are `mcp sync`'s flags, and where the host's environment is
// read.
type Options struct {
	// DryRun computes what would be written and writes nothing: not the
	// guest's file, not the VM record. The VM need not be running.
	DryRun bool
	// Getenv reads the host's environment (HOME, CLAUDE_CONFIG_DIR, the
	// servers' variables); nil is os.Getenv.
	Getenv func(string) string
}

// Result is what Sync did.
type Result struct {
	Branch string `json:"branch"`
	// HostFiles are the host's Claude Code files read (never written).
	HostFiles []string `json:"host_files"`
	// GuestFile is the guest's Claude Code configuration, into whose local
	// scope for the workspace the servers go.
	GuestFile string `json:"guest_file"`
	// Servers says what became of each host server.
	Servers []mcpconfig.Report `json:"servers"`
	// AgentMCP are the servers the VM's agent-mcp serves, which the host
	// connects to (they are not put in the guest's configuration).
	AgentMCP []AgentMCPServer `json:"agent_mcp"`
	// AgentMCPState is agent-mcp's health ("unknown" when the VM is not
	// running).
	AgentMCPState string `json:"agent_mcp_state"`
	// Exposed are the host ports the guest now reaches MCP servers on.
	Exposed []state.Exposed `json:"exposed"`
	// Vars are the names of the variables the agent session must carry.
	Vars []string `json:"vars"`
	// Env are those variables with their values: pass them inline to the
	// agent session (`agent-vm run` does). Never printed, never in JSON.
	Env []mcpconfig.EnvVar `json:"-"`
	// GuestConfig is the part of the guest's file the sync writes, with
	// ${NAME} references and no values.
	GuestConfig json.RawMessage `json:"guest_config"`
	// Written is true when the guest's file and the record were updated.
	Written bool `json:"written"`
	// Unchanged is true when there was nothing to write: no server to
	// bring into the guest, none an earlier sync brought there to take
	// out, so the guest's file was left as it was.
	Unchanged bool `json:"unchanged,omitempty"`
}

// AgentMCPServer is one server of a VM's agent-mcp, as the host reaches it.
type AgentMCPServer struct {
	Name     string `json:"name"`
	URL      string `json:"url"`
	CanStart bool   `json:"can_start"`
	Problem  string `json:"problem,omitempty"`
}

// Sync gives the VM of name the host's Claude Code MCP servers: it reads
// the host's configuration (user and local scope in ~/.claude.json or
// $CLAUDE_CONFIG_DIR/.claude.json, the project scope in the .mcp.json of
// the checkout the VM was created from), merges the guest's equivalent into
// the local scope of /workspace in the guest's ~/.claude.json over SSH, and
// records the host ports the guest needs. The returned Env must reach the
// agent session's environment: the guest's file holds only references.
//
// It takes the VM's lock briefly to update the record: callers must not
// hold it.
func Sync(ctx context.Context, vms VMs, name string, o Options) (*Result, error) {
	e, err := vms.Find(ctx, name)
	if err == nil && e.Record == nil {
		err = e.Err
	}
	if err != nil {
		return nil, err
	}
	r := e.Record
	getenv := o.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	home := getenv("HOME")
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	files := mcpconfig.Locate(getenv, home, r.Git.Source)
	host, err := mcpconfig.Load(files)
	if err != nil {
		return nil, err
	}
	plan := mcpconfig.Convert(host, mcpconfig.Options{
		Lookup: func(k string) (string, bool) { v := getenv(k); return v, v != "" },
		Home:   home, Workspace: guest.Workspace, HostAddr: guest.HostAddr, Programs: vms.GuestPrograms(r.Backend),
		Only: netpolicy.RepoMCP(r),
	})
	res := &Result{Branch: r.Branch, GuestFile: path.Join("/home", r.Guest.User, guest.ClaudeConfig),
		Servers: plan.Reports, Env: plan.Env, AgentMCPState: "unknown"}
	for _, f := range []string{files.ClaudeJSON, files.MCPJSON} {
		if f != "" {
			res.HostFiles = append(res.HostFiles, f)
		}
	}
	for _, v := range plan.Env {
		res.Vars = append(res.Vars, v.Name)
	}
	for _, x := range plan.Exposed {
		res.Exposed = append(res.Exposed, state.Exposed{Port: x.Port, Why: x.Why, By: state.ExposedByMCPSync})
	}
	if res.GuestConfig, err = mcpconfig.Fragment(guest.Workspace, plan.Servers); err != nil {
		return nil, err
	}
	st := vms.State(ctx, e)
	if st == driver.StateRunning {
		res.AgentMCP, res.AgentMCPState = agentMCPServers(ctx, r.Ports.MCP)
	}
	if o.DryRun {
		return res, nil
	}
	if st != driver.StateRunning {
		return nil, fmt.Errorf("VM %q is %s: mcp sync writes into the running guest (hint: `agent-vm start %s` first; `agent-vm mcp sync --dry-run %[3]s` shows what it would write)", r.Branch, st, e.Slug)
	}
	if len(plan.Servers) == 0 && len(r.MCPSynced) == 0 && !slices.ContainsFunc(r.Exposed, func(x state.Exposed) bool { return x.By == state.ExposedByMCPSync }) {
		// Nothing to merge in or take out: the guest is not reached at all
		// (a read and a write of its file are two SSH sessions, which
		// every `run` would wait for before its agent starts).
		res.Unchanged = true
		return res, nil
	}
	c, _, err := vms.Connect(ctx, name)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := WriteGuestClaudeConfig(ctx, c, res.GuestFile, plan.Servers, r.MCPSynced); err != nil {
		return nil, err
	}
	if err := record(ctx, vms, e, res.Exposed, plan.Servers); err != nil {
		return nil, err
	}
	res.Written = true
	return res, nil
}

// Shell lines that read and replace the guest's file as the guest user:
// the new file is made 0600 beside the old one and renamed over it, so
// Claude Code never reads half a file (and a symlink there is replaced,
// not followed).
const (
	readGuestFile  = `f=~/%[1]s; if [ -e "$f" ]; then cat -- "$f"; fi`
	writeGuestFile = `set -e; umask 077; t=$(mktemp ~/%[1]s.agent-vm.XXXXXX); cat >"$t"; chmod 600 "$t"; mv -f -- "$t" ~/%[1]s`
)

// WriteGuestClaudeConfig merges servers into the guest's Claude Code
// configuration over the SSH connection c (the local scope of the
// workspace), removing those of previous that servers lacks; file names
// the guest's file in messages. `agent-vm browser` writes its DevTools
// server with it too.
func WriteGuestClaudeConfig(ctx context.Context, c *ssh.Client, file string, servers map[string]mcpconfig.Server, previous []string) error {
	var cur, stderr bytes.Buffer
	if code, err := sshx.Run(ctx, c, fmt.Sprintf(readGuestFile, guest.ClaudeConfig), nil, &cur, &stderr); err != nil || code != 0 {
		return fmt.Errorf("reading %s in the VM: %s", file, sshFailure(code, err, &stderr))
	}
	out, err := mcpconfig.Merge(cur.Bytes(), file, guest.Workspace, servers, previous)
	if err != nil {
		return err
	}
	stderr.Reset()
	if code, err := sshx.Run(ctx, c, fmt.Sprintf(writeGuestFile, guest.ClaudeConfig), bytes.NewReader(out), io.Discard, &stderr); err != nil || code != 0 {
		return fmt.Errorf("writing %s in the VM: %s", file, sshFailure(code, err, &stderr))
	}
	return nil
}

func sshFailure(code int, err error, stderr *bytes.Buffer) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("exit status %d: %s", code, strings.TrimSpace(stderr.String()))
}

// record stores the ports the sync exposes (replacing its earlier
// ones, keeping other commands') and the servers it wrote.
func record(ctx context.Context, vms VMs, e state.Entry, exposed []state.Exposed, servers map[string]mcpconfig.Server) error {
	lock, err := vms.LockVM(ctx, e.Slug)
	if err != nil {
		return err
	}
	defer lock.Release()
	rec, err := state.ReadRecord(e.Layout.Record())
	if err != nil {
		return err
	}
	pins, err := vms.Pins()
	if err != nil {
		return err
	}
	rec.Exposed = slices.DeleteFunc(rec.Exposed, func(x state.Exposed) bool { return x.By == state.ExposedByMCPSync })
	rec.Exposed = append(rec.Exposed, exposed...)
	if err := netpolicy.Write(e.Layout, rec, pins); err != nil {
		return err
	}
	rec.MCPSynced = rec.MCPSynced[:0]
	for name := range servers {
		rec.MCPSynced = append(rec.MCPSynced, name)
	}
	slices.Sort(rec.MCPSynced)
	return state.WriteRecord(e.Layout.Record(), rec)
}

// agentMCPServers asks the VM's agent-mcp which servers it has, through
// the forwarded port (GET /health needs no token).
func agentMCPServers(ctx context.Context, port int) ([]AgentMCPServer, string) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", port, guest.HealthPath), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, "unreachable"
	}
	defer resp.Body.Close()
	var rep mcpproxy.HealthReport
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&rep); err != nil {
		return nil, "unhealthy"
	}
	var out []AgentMCPServer
	for _, s := range rep.Servers {
		out = append(out, AgentMCPServer{Name: s.Name, URL: fmt.Sprintf("http://127.0.0.1:%d/servers/%s/mcp", port, url.PathEscape(s.Name)),
			CanStart: s.CanStart, Problem: s.Problem})
	}
	if rep.Status != "ok" {
		return out, "unhealthy"
	}
	return out, "healthy"
}
