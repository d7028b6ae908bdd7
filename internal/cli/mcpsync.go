package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/mcpsync"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// mcpCommand groups the MCP verbs that act on a VM.
func mcpCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:        "mcp",
		Usage:       "the host's MCP servers in a VM",
		Subcommands: []*cli.Command{mcpSyncCommand(stdio)},
	}
}

func mcpSyncCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:      "sync",
		Usage:     "give a VM's Claude Code the MCP servers the host's Claude Code has",
		ArgsUsage: "[BRANCH]",
		Description: "Reads the host's Claude Code configuration (~/.claude.json or $CLAUDE_CONFIG_DIR/.claude.json: user\n" +
			"scope and this project's local scope; the project's .mcp.json) and writes the guest's equivalent into the\n" +
			"local scope of /workspace in the VM's ~/.claude.json. The host's files are never changed.\n" +
			"stdio servers run in the VM; servers on the host's loopback are reached at the host's address as the\n" +
			"VM sees it, and their ports are recorded as exposed. Env and header values are not written: the\n" +
			"guest file references variables that agent-vm run passes to the agent session.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "dry-run", Usage: "print what would be written (no values) and write nothing"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON (variable names only, never values)"},
		},
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			name, err := vmName(cliCtx, m)
			if err != nil {
				return err
			}
			res, err := mcpsync.Sync(cliCtx.Context, m, name, mcpsync.Options{DryRun: cliCtx.Bool("dry-run"), Getenv: stdio.Getenv})
			if err != nil {
				return err
			}
			if cliCtx.Bool("json") {
				return writeJSON(stdio.Out, res)
			}
			return printMCPSync(stdio, res)
		}),
	}
}

// printMCPSync prints what a sync did. Names and details come from the
// host's files and the guest's agent-mcp: termsafe for the terminal.
func printMCPSync(stdio IO, res *mcpsync.Result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "MCP servers of the host's Claude Code (%s):\n", termsafe.Line(strings.Join(res.HostFiles, ", ")))
	if len(res.Servers) == 0 {
		b.WriteString("  none\n")
	}
	rows := [][]string{{"  NAME", "SCOPE", "TRANSPORT", "IN THE VM", "DETAIL"}}
	for _, s := range res.Servers {
		rows = append(rows, []string{"  " + termsafe.Line(s.Name), s.Scope, termsafe.Line(s.Transport), s.Action, termsafe.Line(s.Detail)})
		if len(s.Missing) > 0 {
			rows = append(rows, []string{"", "", "", "", "unset on the host: " + termsafe.Line(strings.Join(s.Missing, ", "))})
		}
	}
	if len(res.Servers) > 0 {
		if err := writeTable(&b, rows); err != nil {
			return err
		}
	}
	fmt.Fprintf(&b, "\nagent-mcp in the VM (%s), for the host to connect to:\n", res.AgentMCPState)
	if len(res.AgentMCP) == 0 {
		b.WriteString("  no servers known (the VM is not running, or agent-mcp serves none)\n")
	}
	for _, s := range res.AgentMCP {
		fmt.Fprintf(&b, "  %s  %s\n", termsafe.Line(s.Name), termsafe.Line(s.URL))
	}
	if len(res.Exposed) > 0 {
		b.WriteString("\nHost ports the VM reaches MCP servers on:\n")
		for _, x := range res.Exposed {
			fmt.Fprintf(&b, "  %s  %s\n", strconv.Itoa(x.Port), termsafe.Line(x.Why))
		}
		b.WriteString("  The VM reaches the host's loopback on these ports only (and on those agent-vm port expose opened); a VM whose network is not contained (agent-vm net show says) reaches all of it.\n")
	}
	switch {
	case res.Written:
		fmt.Fprintf(&b, "\nWrote the servers into %s (projects[\"/workspace\"].mcpServers).\n", res.GuestFile)
	case res.Unchanged:
		fmt.Fprintf(&b, "\nNothing to write: no server to bring into %s, and none an earlier sync brought there.\n", res.GuestFile)
	default:
		fmt.Fprintf(&b, "\nDry run: nothing written. It would merge this into %s:\n%s", res.GuestFile, safeLines(string(res.GuestConfig)))
	}
	if len(res.Vars) > 0 {
		fmt.Fprintf(&b, "agent-vm run passes these variables to the agent session (values from the host, never on the VM's disk):\n  %s\n",
			strings.Join(res.Vars, "\n  "))
	}
	_, err := fmt.Fprint(stdio.Out, b.String())
	return err
}

// safeLines is termsafe.String for each line of a multi-line text.
func safeLines(s string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		lines[i] = termsafe.String(strings.TrimSuffix(l, "\n")) + l[len(strings.TrimSuffix(l, "\n")):]
	}
	return strings.Join(lines, "")
}
