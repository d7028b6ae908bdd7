package cmdline

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"
)

// Shape holds app and every command below it to agent-vm's grammar of a
// command line, which the verbs and the hidden commands keep alike: flags
// may follow the positional arguments (Run), a repeatable flag takes one
// value per use, a mistake in the flags is a usage error (exit 2), a
// string flag given "" is refused rather than taken as its default, an
// unknown command is named with the nearest known one, and help is a word
// as well as a flag at every depth (HelpCommand, a group's own help word).
// Call it once app has its flags and commands.
func Shape(app *cli.App) {
	// A repeatable flag takes one value per use: a comma is part of the
	// value (and reaches its validator), not a separator.
	app.DisableSliceFlagSeparator = true
	app.ExitErrHandler = func(*cli.Context, error) {} // Report maps errors
	app.OnUsageError = func(_ *cli.Context, err error, _ bool) error {
		return Usagef("%v", err)
	}
	before := app.Before
	app.Before = func(cliCtx *cli.Context) error {
		if err := refuseEmpty(cliCtx, cliCtx.App.Flags); err != nil {
			return err
		}
		if before != nil {
			return before(cliCtx)
		}
		return nil
	}
	noBoolDefaults(app.Flags)
	plainDefaults(app.Flags)
	for _, c := range app.Commands {
		shape(c)
	}
	app.CommandNotFound = func(cliCtx *cli.Context, name string) {
		// Only reached for unknown subcommands of a command; report it.
		fmt.Fprintln(cliCtx.App.ErrWriter, UnknownCommand(cliCtx.App.Commands, "", name))
	}
}

// shape holds c and its subcommands to the grammar: a group takes help as
// its first word, a command whose argument is an optional BRANCH takes
// help alone as asking for its help, a flag's error is a usage error, an
// empty string flag is refused.
func shape(c *cli.Command) {
	if len(c.Subcommands) > 0 {
		// A group's help lists its own subcommands, not urfave's `help`
		// (`agent-vm help GROUP SUB` is the top-level help command's).
		c.HideHelpCommand = true
		if act := c.Action; act == nil {
			c.Action = groupAction(c)
		} else {
			// A group that does something itself (sessions [BRANCH])
			// still takes help as its first word, as every group does.
			help := groupAction(c)
			c.Action = func(cliCtx *cli.Context) error {
				if cliCtx.Args().First() == "help" {
					return help(cliCtx)
				}
				return act(cliCtx)
			}
		}
	}
	if len(c.Subcommands) == 0 && strings.HasPrefix(c.ArgsUsage, "[BRANCH]") && c.Action != nil {
		c.Action = helpWord(c.Action)
	}
	noBoolDefaults(c.Flags)
	plainDefaults(c.Flags)
	c.OnUsageError = func(_ *cli.Context, err error, _ bool) error {
		return Usagef("%s: %v", c.Name, err)
	}
	before := c.Before
	c.Before = func(cliCtx *cli.Context) error {
		if err := refuseEmpty(cliCtx, c.Flags); err != nil {
			return err
		}
		if before != nil {
			return before(cliCtx)
		}
		return nil
	}
	for _, sub := range c.Subcommands {
		shape(sub)
	}
}

// noBoolDefaults drops urfave's "(default: false)" from the help of
// boolean flags: a switch is off unless given.
func noBoolDefaults(flags []cli.Flag) {
	for _, f := range flags {
		if b, ok := f.(*cli.BoolFlag); ok && !b.DisableDefaultText {
			b.DisableDefaultText = true
		}
	}
}

// plainDefaults prints a string flag's default as every other default is
// printed, "(default: auto)", not urfave's quoted "(default: \"auto\")".
func plainDefaults(flags []cli.Flag) {
	for _, f := range flags {
		if s, ok := f.(*cli.StringFlag); ok && s.Value != "" && s.DefaultText == "" {
			s.DefaultText = s.Value
		}
	}
}

// refuseEmpty is a usage error for a string flag given an empty value on
// the command line (--branch ""), which would otherwise silently mean the
// flag's default.
func refuseEmpty(cliCtx *cli.Context, flags []cli.Flag) error {
	for _, f := range flags {
		if _, ok := f.(*cli.StringFlag); !ok {
			continue
		}
		name := f.Names()[0]
		if cliCtx.IsSet(name) && cliCtx.String(name) == "" {
			return Usagef("--%s is empty (hint: give it a value, or leave the flag out for its default)", name)
		}
	}
	return nil
}
