package cmdline

import (
	"slices"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"
)

// HelpCommand is `agent-vm help [COMMAND [SUBCOMMAND]]`, which prints what
// `agent-vm COMMAND [SUBCOMMAND] --help` does. urfave/cli's own help
// command reads only its first word, so `help image build` would show
// image's help.
func HelpCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:      "help",
		Usage:     "show the help of agent-vm or of one command",
		ArgsUsage: "[COMMAND [SUBCOMMAND]]",
		// urfave's --help of a command named help prints the App's help.
		SkipFlagParsing: true,
		Action: HelpFirst(stdio, func(cliCtx *cli.Context) error {
			words := cliCtx.Args().Slice()
			cmds := cliCtx.App.Commands
			for i, w := range words {
				c := FindCommand(cmds, w)
				if c == nil {
					return UnknownCommand(cmds, strings.Join(words[:i], " "), w)
				}
				cmds = c.Subcommands
			}
			args := append(append([]string{cliCtx.App.Name}, words...), "--help")
			return cliCtx.App.RunContext(cliCtx.Context, args)
		}),
	}
}

// HelpFirst is the action of a command that skips flag parsing (exec,
// help), where urfave never sees --help: given -h or --help first, it
// prints the command's help as urfave prints a leaf command's, else it
// runs action. (ShowCommandHelp, given the command's own context, would
// look for the command among its own subcommands.)
func HelpFirst(stdio IO, action cli.ActionFunc) cli.ActionFunc {
	return func(cliCtx *cli.Context) error {
		if a := cliCtx.Args().First(); a == "-h" || a == "--help" {
			cli.HelpPrinter(stdio.Out, cli.CommandHelpTemplate, cliCtx.Command)
			return nil
		}
		return action(cliCtx)
	}
}

// FindCommand is the command of cmds called name (or one of its aliases).
func FindCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

// groupAction is the action of a command that is only its subcommands
// (`image`, `port`): alone it shows its help; with a word that names none
// of them it is a usage error, as an unknown top-level command is.
func groupAction(c *cli.Command) cli.ActionFunc {
	return func(cliCtx *cli.Context) error {
		args := cliCtx.Args()
		if !args.Present() || args.First() == "help" && args.Len() == 1 {
			return cli.ShowSubcommandHelp(cliCtx)
		}
		if args.First() == "help" {
			// `agent-vm net help allow`, as `agent-vm help net allow`.
			if sub := findSubcommand(c.Subcommands, args.Get(1)); sub != nil && args.Len() == 2 {
				return cli.ShowCommandHelp(cliCtx, sub.Name)
			}
			return UnknownCommand(c.Subcommands, c.Name, strings.Join(args.Tail(), " "))
		}
		return UnknownCommand(c.Subcommands, c.Name, args.First())
	}
}

// findSubcommand is the visible command of cmds called name (or one of its
// aliases), or nil.
func findSubcommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if !c.Hidden && slices.Contains(c.Names(), name) {
			return c
		}
	}
	return nil
}

// helpWord is the action of a command whose first argument is an optional
// BRANCH (status [BRANCH]): help alone prints its help, as a group's help
// word does (sessions help), rather than looking for a VM called help. A
// branch called help is still the VM of a checkout of it, with BRANCH left
// out.
func helpWord(action cli.ActionFunc) cli.ActionFunc {
	return func(cliCtx *cli.Context) error {
		if cliCtx.NArg() == 1 && cliCtx.Args().First() == "help" {
			cli.HelpPrinter(cliCtx.App.Writer, cli.CommandHelpTemplate, cliCtx.Command)
			return nil
		}
		return action(cliCtx)
	}
}

// UnknownCommand says a command (a subcommand of parent, when given) does
// not exist among cmds, suggesting the nearest.
func UnknownCommand(cmds []*cli.Command, parent, name string) error {
	var names []string
	for _, c := range cmds {
		if !c.Hidden {
			names = append(names, c.Name)
		}
	}
	sort.Strings(names)
	prefix := ""
	if parent != "" {
		prefix = parent + " "
	}
	if best := nearest(name, names); best != "" {
		return Usagef("unknown command %q (did you mean %q?)", prefix+name, prefix+best)
	}
	return Usagef("unknown command %q; commands: %s", prefix+name, prefix+strings.Join(names, ", "+prefix))
}

// nearest returns the candidate closest to s by edit distance, if close.
func nearest(s string, candidates []string) string {
	best, bestD := "", 1<<30
	for _, c := range candidates {
		d := editDistance(s, c)
		if strings.HasPrefix(c, s) && len(s) >= 2 {
			d = 1
		}
		if d < bestD {
			best, bestD = c, d
		}
	}
	if bestD <= max(2, len(s)/3) {
		return best
	}
	return ""
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
