package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/agent-vm/agent-vm/internal/top"
	"github.com/agent-vm/agent-vm/internal/vm"
	"github.com/agent-vm/agent-vm/internal/vminfo"
)

// maxBranchColumn bounds the BRANCH column of the list table (in terminal
// columns), so one long branch name does not widen every row; --json has
// the names whole.
const maxBranchColumn = 40

// maxRepoColumn bounds the REPO column the same way, keeping a path's end.
const maxRepoColumn = 40

func listCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:    "list",
		Aliases: []string{"ls"},
		Usage:   "list the VMs",
		Flags:   []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON: the fields of status --json, without the token, and what top shows of each VM (sessions, agent_state, last_line, pss_bytes, connections_1m, refused_1m, asks)"}},
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			if err := cmdline.NoArgs(cliCtx); err != nil {
				return err
			}
			entries, err := m.List(cliCtx.Context)
			if err != nil {
				return err
			}
			infos := make([]vminfo.Info, 0, len(entries))
			for _, en := range entries {
				info := m.Status(cliCtx.Context, en, false)
				info.MCP.Token = ""
				infos = append(infos, info)
			}
			if cliCtx.Bool("json") {
				// Each VM's status and what it is doing (top's).
				type listed struct {
					vminfo.Info
					top.Live
					LiveError string `json:"live_error,omitempty"`
				}
				out := make([]listed, 0, len(infos))
				for k, en := range entries {
					l, err := (&top.Gatherer{VMs: m}).Live(cliCtx.Context, en, infos[k])
					out = append(out, listed{Info: infos[k], Live: l, LiveError: errText(err)})
				}
				return writeJSON(stdio.Out, out)
			}
			if len(infos) == 0 {
				fmt.Fprintf(stdio.Out, "no VMs in %s (hint: `agent-vm create` makes one for the current branch)\n", m.Root.Dir)
				return nil
			}
			rows := [][]string{{"BRANCH", "REPO", "NAME", "BACKEND", "STATE", "SSH", "MCP", "CREATED", ""}}
			for _, i := range infos {
				if i.State == vminfo.StateInvalid && i.Branch == "" {
					rows = append(rows, []string{"-", "-", i.Slug, "-", i.State, "-", "-", "-", i.Error})
					continue
				}
				note := ""
				if i.State == vminfo.StateCrashed || i.State == vminfo.StateInvalid {
					note = i.Detail
				}
				backend, sshPort, mcpPort := i.Backend, strconv.Itoa(i.Ports.SSH), strconv.Itoa(i.Ports.MCP)
				if i.Foreign != "" {
					backend, sshPort, mcpPort = i.Backend+" (repo's Vagrantfile)", "-", "-"
				}
				if i.Host != "" {
					backend += " on " + i.Host
				}
				rows = append(rows, []string{termsafe.Truncate(i.Branch, maxBranchColumn), termsafe.TruncateStart(homeRel(i.Git.Source), maxRepoColumn),
					i.Slug, backend, i.StateText(), sshPort, mcpPort,
					i.CreatedAt.Local().Format("2006-01-02 15:04"), note})
			}
			return writeTable(stdio.Out, rows)
		}),
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// homeRel shortens a path under the home directory to ~/...
func homeRel(p string) string {
	home, err := os.UserHomeDir()
	if err != nil || home == "" || home == "/" {
		return p
	}
	if rel, err := filepath.Rel(home, p); err == nil && !strings.HasPrefix(rel, "..") {
		return filepath.Join("~", rel)
	}
	return p
}
