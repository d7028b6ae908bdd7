package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/vm"
)

func listCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:      "list",
		Aliases:   []string{"ls"},
		Usage:     "list the VMs",
		ArgsUsage: " ",
		Flags:     []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON (the fields of `status --json`, without the token)"}},
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			if err := noArgs(cliCtx); err != nil {
				return err
			}
			entries, err := m.List(cliCtx.Context)
			if err != nil {
				return err
			}
			infos := make([]vm.Info, 0, len(entries))
			for _, en := range entries {
				info := m.Status(cliCtx.Context, en, false)
				info.MCP.Token = ""
				infos = append(infos, info)
			}
			if cliCtx.Bool("json") {
				return writeJSON(stdio.Out, infos)
			}
			if len(infos) == 0 {
				fmt.Fprintf(stdio.Out, "no VMs in %s (hint: `agent-vm create` makes one for the current branch)\n", m.Root.Dir)
				return nil
			}
			tw := tabwriter.NewWriter(stdio.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "BRANCH\tREPO\tNAME\tBACKEND\tSTATE\tSSH\tMCP\tCREATED\t")
			for _, i := range infos {
				if i.State == vm.StateInvalid && i.Branch == "" {
					fmt.Fprintf(tw, "-\t-\t%s\t-\t%s\t-\t-\t-\t%s\n", i.Slug, i.State, i.Error)
					continue
				}
				note := ""
				if i.State == vm.StateCrashed || i.State == vm.StateInvalid {
					note = i.Detail
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", i.Branch, homeRel(i.Git.Source), i.Slug, i.Backend, i.State, i.Ports.SSH, i.Ports.MCP,
					i.CreatedAt.Local().Format("2006-01-02 15:04"), note)
			}
			return tw.Flush()
		}),
	}
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
