package cli

import (
	"regexp"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
)

// commandPaths lists the words that name every visible command and
// subcommand below cmds, parents before children.
func commandPaths(cmds []*cli.Command, parent []string) [][]string {
	var out [][]string
	for _, c := range cmds {
		if c.Hidden {
			continue
		}
		p := append(append([]string{}, parent...), c.Name)
		out = append(out, p)
		out = append(out, commandPaths(c.Subcommands, p)...)
	}
	return out
}

// placeholderRE is what a Usage may hold in backticks: urfave/cli v2 has no
// Placeholder field, it takes the first backticked word of a Usage as the
// flag's placeholder (`--agent NAME`), so that is the only place for one.
var placeholderRE = regexp.MustCompile("^[^`]*`[A-Z][A-Z0-9_|]*`[^`]*$")

// TestHelpOfEveryCommand reads the help of every visible command and
// subcommand both ways a user asks for it, checks what urfave/cli does to
// the flags' usage strings, that no line ends in spaces, that a group's
// own help word (agent-vm net help allow) gives the same help, and that a
// group lists its own subcommands.
func TestHelpOfEveryCommand(t *testing.T) {
	app := newApp(IO{})
	paths := append([][]string{nil}, commandPaths(app.Commands, nil)...)
	st := t.TempDir()
	for _, path := range paths {
		name := strings.Join(append([]string{"agent-vm"}, path...), " ")
		flagged := agentVM(t, "", st, append(append([]string{}, path...), "--help")...)
		asked := agentVM(t, "", st, append([]string{"help"}, path...)...)
		for _, r := range []struct {
			how string
			result
		}{{name + " --help", flagged}, {"agent-vm help " + strings.Join(path, " "), asked}} {
			out := r.stdout + r.stderr
			switch {
			case r.code != 0:
				t.Errorf("%s: exit %d\n%s", r.how, r.code, out)
			case r.stderr != "":
				t.Errorf("%s: help goes to stdout, got stderr:\n%s", r.how, r.stderr)
			case strings.Contains(out, "unknown command") || strings.Contains(out, "did you mean") || strings.Contains(out, "No help topic"):
				t.Errorf("%s: a command it does not find:\n%s", r.how, out)
			case !strings.Contains(r.stdout, "\n   "+name+" "):
				t.Errorf("%s: not the help of %s:\n%s", r.how, name, out)
			}
		}
		checkHelpLines(t, name, flagged.stdout)
		if asked.stdout != flagged.stdout {
			t.Errorf("agent-vm help %s and %s --help differ:\n%s\n----\n%s", strings.Join(path, " "), name, asked.stdout, flagged.stdout)
		}
		if c := findPath(app, path); c != nil && (len(c.Subcommands) > 0 || strings.HasPrefix(c.ArgsUsage, "[BRANCH]")) {
			// A group's help word alone (agent-vm sessions help), and
			// a command's whose argument is an optional BRANCH
			// (agent-vm status help).
			within := agentVM(t, "", st, append(append([]string{}, path...), "help")...)
			if within.code != 0 || within.stdout != flagged.stdout {
				t.Errorf("agent-vm %s help: exit %d, and it differs from %s --help:\n%s%s", strings.Join(path, " "), within.code, name, within.stdout, within.stderr)
			}
		}
		if n := len(path); n >= 2 {
			// The group's own help word: agent-vm net help allow.
			within := agentVM(t, "", st, append(append(append([]string{}, path[:n-1]...), "help"), path[n-1])...)
			if within.code != 0 || within.stdout != flagged.stdout {
				t.Errorf("agent-vm %s help %s: exit %d, and it differs from %s --help:\n%s%s", strings.Join(path[:n-1], " "), path[n-1], within.code, name, within.stdout, within.stderr)
			}
		}
		flags, cmds := app.VisibleFlags(), app.Commands
		for _, w := range path {
			c := cmdline.FindCommand(cmds, w)
			flags, cmds = c.VisibleFlags(), c.Subcommands
		}
		checkFlagLines(t, name, flags, flagged.stdout)
		if len(path) > 0 && len(cmds) > 0 {
			if got, want := listedCommands(flagged.stdout), commandNames(cmds); got != want {
				t.Errorf("%s --help lists the subcommands %q, want %q", name, got, want)
			}
		}
	}
}

// defaultRE is a default as agent-vm prints it, "(default: VALUE" or
// "; default: VALUE"; badDefaultRE the others: without the colon, or
// quoted as urfave quotes a string flag's.
var (
	defaultRE    = regexp.MustCompile(`default: [^"]`)
	badDefaultRE = regexp.MustCompile(`\(default [^:]|default: "`)
)

// checkHelpLines holds every line of a help to the rules of agent-vm's
// help: no literal backticks (urfave/cli prints a Description's and a
// Usage's as they are), no line ending in spaces, one style of default.
func checkHelpLines(t *testing.T, name, help string) {
	t.Helper()
	for _, l := range strings.Split(help, "\n") {
		switch {
		case strings.Contains(l, "`"):
			t.Errorf("%s --help: a line has a literal backtick: %q", name, l)
		case strings.HasSuffix(l, " "):
			t.Errorf("%s --help: a line ends in spaces: %q", name, l)
		case badDefaultRE.MatchString(l):
			t.Errorf("%s --help: a default not written (default: VALUE): %q", name, l)
		}
	}
}

// findPath is the command path names below app.
func findPath(app *cli.App, path []string) *cli.Command {
	var c *cli.Command
	cmds := app.Commands
	for _, w := range path {
		c = cmdline.FindCommand(cmds, w)
		cmds = c.Subcommands
	}
	return c
}

// sizeFlags are the flags that take a SIZE (internal/size's grammar).
var sizeFlags = map[string]bool{"memory": true, "disk": true}

// bareUnitRE is how a size flag's usage names the unit of a bare number.
var bareUnitRE = regexp.MustCompile(`a bare number is in [KMGT]iB\b`)

// The hidden commands' help keeps the same rules: agent-vm runs them, but a
// reader debugging it reads their help.
func TestHelpOfHiddenCommands(t *testing.T) {
	st := t.TempDir()
	for _, c := range newApp(IO{}).Commands {
		if !c.Hidden {
			continue
		}
		r := agentVM(t, "", st, c.Name, "--help")
		if r.code != 0 || !strings.Contains(r.stdout, "agent-vm "+c.Name) {
			t.Errorf("agent-vm %s --help: exit %d\n%s%s", c.Name, r.code, r.stdout, r.stderr)
			continue
		}
		checkHelpLines(t, "agent-vm "+c.Name, r.stdout)
	}
}

// listedCommands is the names the COMMANDS section of a help lists.
func listedCommands(help string) string {
	_, section, _ := strings.Cut(help, "\nCOMMANDS:\n")
	section, _, _ = strings.Cut(section, "\n\n")
	var names []string
	for _, l := range strings.Split(section, "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(l), " ")
		names = append(names, strings.TrimSuffix(name, ","))
	}
	return strings.Join(names, " ")
}

// commandNames is the names of the visible commands of cmds.
func commandNames(cmds []*cli.Command) string {
	var names []string
	for _, c := range cmds {
		if !c.Hidden {
			names = append(names, c.Name)
		}
	}
	return strings.Join(names, " ")
}

// checkFlagLines fails on a usage string urfave/cli does not print as
// written, and on a flag line with two defaults (the usage's own and
// urfave's).
func checkFlagLines(t *testing.T, name string, flags []cli.Flag, help string) {
	t.Helper()
	for _, f := range flags {
		usage := f.(cli.DocGenerationFlag).GetUsage()
		flag := "--" + f.Names()[0]
		if strings.Contains(usage, "`") && !placeholderRE.MatchString(usage) {
			t.Errorf("%s %s: usage %q has backticks: urfave/cli makes the first backticked words the flag's placeholder (hint: write it without them, or backtick one upper-case placeholder such as `NAME`)", name, flag, usage)
			continue
		}
		rendered := strings.ReplaceAll(usage, "`", "")
		line := ""
		for _, l := range strings.Split(help, "\n") {
			if strings.Contains(l, rendered) && strings.Contains(l, flag) {
				line = l
				break
			}
		}
		if line == "" {
			t.Errorf("%s: no line of its help has %s with its usage as written, %q:\n%s", name, flag, rendered, help)
			continue
		}
		if sizeFlags[f.Names()[0]] && (!bareUnitRE.MatchString(usage) || !strings.Contains(line, flag+" SIZE")) {
			t.Errorf("%s %s: a size flag's help names its placeholder SIZE and the unit of a bare number (a bare number is in MiB): %q", name, flag, strings.TrimSpace(line))
		}
		if strings.Contains(line, "default") && !defaultRE.MatchString(line) && !strings.Contains(usage, "default") {
			t.Errorf("%s %s: a default not written (default: VALUE): %q", name, flag, strings.TrimSpace(line))
		}
		if strings.Count(line, "(default") > 1 || strings.Count(line, "default:") > 1 {
			t.Errorf("%s %s: two defaults in %q", name, flag, strings.TrimSpace(line))
		}
	}
}

// --help shows the command groups in categories' order, each once, with
// every visible top-level command under one of them.
func TestHelpGroupsInOrder(t *testing.T) {
	r := agentVM(t, "", t.TempDir(), "--help")
	last := -1
	for _, c := range categories {
		i := strings.Index(r.stdout, "\n   "+c+":\n")
		if i < 0 || strings.Count(r.stdout, "\n   "+c+":\n") != 1 {
			t.Errorf("--help shows the group %q %d times, want once:\n%s", c, strings.Count(r.stdout, "\n   "+c+":\n"), r.stdout)
			continue
		}
		if i < last {
			t.Errorf("--help shows %q out of order (want %v):\n%s", c, categories, r.stdout)
		}
		last = i
	}
	for _, c := range newApp(IO{}).Commands {
		if !c.Hidden && !strings.Contains(r.stdout, "\n     "+c.Name) {
			t.Errorf("--help does not list %s", c.Name)
		}
	}
}

// TestOneGrammar holds every visible command to one way of naming a VM and
// a session: a BRANCH argument is optional (left out, the checked-out
// branch), a command with positional arguments of its own names the VM
// with --vm BRANCH, and a session is named with --session NAME, never as
// an argument.
func TestOneGrammar(t *testing.T) {
	app := newApp(IO{})
	for _, path := range commandPaths(app.Commands, nil) {
		c := findPath(app, path)
		name := strings.Join(path, " ")
		if rest := strings.ReplaceAll(c.ArgsUsage, "[BRANCH]", ""); strings.Contains(rest, "BRANCH") {
			t.Errorf("%s takes %q: a BRANCH argument is optional, [BRANCH], or the flag --vm BRANCH", name, c.ArgsUsage)
		}
		if strings.Contains(c.ArgsUsage, "SESSION") {
			t.Errorf("%s takes %q: a session is named with --session NAME", name, c.ArgsUsage)
		}
		for _, f := range c.VisibleFlags() {
			want := map[string]string{"vm": "BRANCH", "session": "NAME"}[f.Names()[0]]
			if want == "" {
				continue
			}
			if _, ph := unquoteUsage(f.(cli.DocGenerationFlag).GetUsage()); ph != want {
				t.Errorf("%s --%s takes %q, want %s", name, f.Names()[0], ph, want)
			}
		}
	}
}

// unquoteUsage is urfave/cli's reading of a usage: its first backticked
// word is the placeholder.
func unquoteUsage(usage string) (string, string) {
	_, rest, ok := strings.Cut(usage, "`")
	if !ok {
		return usage, ""
	}
	ph, _, _ := strings.Cut(rest, "`")
	return strings.ReplaceAll(usage, "`", ""), ph
}
