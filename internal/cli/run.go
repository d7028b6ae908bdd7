package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/agent"
	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/vm"
	"github.com/agent-vm/agent-vm/internal/vminfo"
	"github.com/agent-vm/agent-vm/internal/wire"
)

func startFlags() []cli.Flag {
	return []cli.Flag{
		timeoutFlag(bootTimeout),
		&cli.BoolFlag{Name: "reprovision", Usage: "run the guest's first-boot setup again (cloud-init)"},
		&cli.StringFlag{Name: "nixpkgs", Usage: "the nixpkgs to build the VM from, a PATH or FLAKEREF (nixos backend; default: the one create chose)"},
		&cli.BoolFlag{Name: "cold", Usage: "boot a suspended VM afresh, discarding its saved state (and the processes it held)"},
		&cli.BoolFlag{Name: "no-template", Usage: "boot a new VM cold even when a template fits it (agent-vm template)"},
		workspaceCacheFlag("from this start on"),
	}
}

// bootTimeout is what --timeout of a boot defaults to (vm scales it up
// on a busy host).
const bootTimeout = "5m with KVM, 15m with TCG"

// timeoutFlag is the --timeout of the verbs that boot or resume a VM.
func timeoutFlag(defaultText string) cli.Flag {
	return boundedTimeoutFlag("how long to wait for SSH and agent-mcp to answer", defaultText)
}

// boundedTimeoutFlag is a --timeout whose usage says what it bounds.
func boundedTimeoutFlag(usage, defaultText string) cli.Flag {
	return &cli.DurationFlag{Name: "timeout", Usage: usage, DefaultText: defaultText}
}

// workspaceCacheFlag is create's and start's --workspace-cache.
func workspaceCacheFlag(when string) cli.Flag {
	return &cli.StringFlag{Name: "workspace-cache", Usage: "how the guest caches the workspace (virtiofs), " + when + ": auto (the default; host edits show within about a second), always (faster for many small files; host edits may not show until the guest drops its caches) or none (every access asks the host)"}
}

func startCommand(stdio IO) *cli.Command {
	return bootCommand(stdio, "start", "boot a VM and wait until SSH and agent-mcp answer", (*vm.Manager).Start)
}

func restartCommand(stdio IO) *cli.Command {
	return bootCommand(stdio, "restart", "stop a VM (if it runs) and start it again", (*vm.Manager).Restart)
}

// bootCommand is start or restart: the same flags, progress and output.
func bootCommand(stdio IO, name, usage string, boot func(*vm.Manager, context.Context, string, vm.StartOptions) (*vm.StartResult, error)) *cli.Command {
	return &cli.Command{
		Name:         name,
		Usage:        usage,
		ArgsUsage:    "[BRANCH]",
		Flags:        startFlags(),
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			branch, err := vmName(cliCtx, m)
			if err != nil {
				return err
			}
			if err := m.Host.Prepare(cliCtx.Context); err != nil {
				return err
			}
			p := newProgress(stdio.Err)
			res, err := boot(m, cliCtx.Context, branch, startOptions(cliCtx, p))
			p.done()
			if err != nil {
				return err
			}
			printStarted(stdio, res)
			if hint := wire.Templates(m).Hint(res.NoTemplateYet, res.SSHReady); hint != "" {
				fmt.Fprintf(stdio.Err, "agent-vm: %s\n", hint)
			}
			return nil
		}),
	}
}

func startOptions(cliCtx *cli.Context, p *progress) vm.StartOptions {
	return vm.StartOptions{Timeout: cliCtx.Duration("timeout"), Report: p.reporter(), Reprovision: cliCtx.Bool("reprovision"),
		Nixpkgs: cliCtx.String("nixpkgs"), Cold: cliCtx.Bool("cold"), NoTemplate: cliCtx.Bool("no-template"),
		WorkspaceCache: cliCtx.String("workspace-cache")}
}

func printStarted(stdio IO, res *vm.StartResult) {
	i := res.Info
	switch {
	case res.AlreadyRunning:
		fmt.Fprintf(stdio.Out, "VM %s (branch %s) is already running\n", i.Slug, i.Branch)
	case res.FromTemplate:
		fmt.Fprintf(stdio.Out, "started VM %s (branch %s) from its template: SSH after %s, agent-mcp after %s (%s, workspace over %s)\n",
			i.Slug, i.Branch, res.SSHReady.Round(100*time.Millisecond), res.HealthReady.Round(100*time.Millisecond), i.Accel, i.Share)
	case res.Resumed:
		fmt.Fprintf(stdio.Out, "resumed VM %s (branch %s): SSH after %s, agent-mcp after %s (workspace over %s)\n",
			i.Slug, i.Branch, res.SSHReady.Round(100*time.Millisecond), res.HealthReady.Round(100*time.Millisecond), i.Share)
	default:
		fmt.Fprintf(stdio.Out, "started VM %s (branch %s): SSH after %s, agent-mcp after %s (%s, workspace over %s)\n",
			i.Slug, i.Branch, res.SSHReady.Truncate(time.Second), res.HealthReady.Truncate(time.Second), i.Accel, i.Share)
	}
	fmt.Fprintf(stdio.Out, "  shell: agent-vm shell %s    (or ssh %s, after `agent-vm ssh-config >> ~/.ssh/config`)\n", i.Slug, i.SSH.Alias)
	fmt.Fprintf(stdio.Out, "  mcp:   %s    (client config: agent-vm mcp-config %s)\n", i.MCP.URL, i.Slug)
	fmt.Fprintf(stdio.Out, "  agent: %s\n", i.Agent.State)
}

func stopCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:         "stop",
		Usage:        "shut a VM down cleanly: ask the guest to power off, and force it off after a grace period (30s, 90s without KVM)",
		ArgsUsage:    "[BRANCH]",
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			name, err := vmName(cliCtx, m)
			if err != nil {
				return err
			}
			res, err := m.Stop(cliCtx.Context, name)
			if err != nil {
				return err
			}
			switch res.Was {
			case vminfo.StateStopped:
				fmt.Fprintf(stdio.Out, "VM of branch %s is not running\n", res.Branch)
			case vminfo.StateCrashed:
				fmt.Fprintf(stdio.Out, "VM of branch %s had crashed; cleaned up what it left\n", res.Branch)
			case vminfo.StateSuspended:
				fmt.Fprintln(stdio.Out, stoppedSuspended(res))
			default:
				fmt.Fprintf(stdio.Out, "stopped the VM of branch %s\n", res.Branch)
			}
			return nil
		}),
	}
}

func execCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:      "exec",
		Usage:     "run a command in the VM's /workspace; its exit status becomes agent-vm's",
		ArgsUsage: "[BRANCH] -- COMMAND [ARGS...]",
		// exec has no flags of its own: everything after BRANCH belongs to
		// the command, and "--" must be seen to tell BRANCH from COMMAND.
		SkipFlagParsing: true,
		Action: cmdline.HelpFirst(stdio, withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			name, argv, err := splitExecArgs(cliCtx.Args().Slice())
			if err != nil {
				return err
			}
			if name == "" {
				if name, err = currentBranch(cliCtx, m); err != nil {
					return err
				}
			}
			code, err := m.Exec(cliCtx.Context, name, argv, stdio.In, stdio.Out, stdio.Err)
			if err != nil {
				return err
			}
			if code != 0 {
				return cmdline.ExitStatus(code)
			}
			return nil
		})),
	}
}

// splitExecArgs reads `[BRANCH] -- COMMAND [ARGS...]` (or `BRANCH COMMAND
// [ARGS...]`). An empty name means the current branch.
func splitExecArgs(args []string) (name string, argv []string, err error) {
	switch {
	case len(args) > 0 && args[0] == "--":
		argv = args[1:]
	case len(args) > 1 && args[1] == "--":
		name, argv = args[0], args[2:]
	case len(args) > 1:
		name, argv = args[0], args[1:]
	}
	if len(argv) == 0 {
		return "", nil, cmdline.Usagef("exec needs a command (hint: agent-vm exec BRANCH -- COMMAND [ARGS...])")
	}
	return name, argv, nil
}

func shellCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:         "shell",
		Usage:        "open a login shell in the VM's /workspace",
		ArgsUsage:    "[BRANCH]",
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			name, err := vmName(cliCtx, m)
			if err != nil {
				return err
			}
			code, err := m.Shell(cliCtx.Context, name, stdio.In, stdio.Out, stdio.Err)
			if err != nil {
				return err
			}
			if code != 0 {
				return cmdline.ExitStatus(code)
			}
			return nil
		}),
	}
}

func logsCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:      "logs",
		Usage:     "show the VM's serial console and, when it runs, agent-mcp's journal",
		ArgsUsage: "[BRANCH]",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing new lines"},
			&cli.IntFlag{Name: "lines", Aliases: []string{"n"}, Value: 200, Usage: "lines of each log to show first"},
			sessionFlag("print the scrollback of the agent session `NAME` instead (agent-vm sessions lists them)"),
		},
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			if n := cliCtx.Int("lines"); n < 1 {
				return cmdline.Usagef("--lines %d must be at least 1 (hint: -n 50 shows the last 50 lines of each log)", n)
			}
			name, err := vmName(cliCtx, m)
			if err != nil {
				return err
			}
			if sess := cliCtx.String("session"); sess != "" {
				if cliCtx.Bool("follow") {
					return cmdline.Usagef("--follow does not go with --session (hint: agent-vm attach %s --session %s shows the session live)", name, sess)
				}
				return agent.Log(cliCtx.Context, m, name, sess, stdio.Out)
			}
			err = m.Logs(cliCtx.Context, name, vm.LogsOptions{Follow: cliCtx.Bool("follow"), Lines: cliCtx.Int("lines")}, stdio.Out)
			if cliCtx.Bool("follow") && errors.Is(err, cliCtx.Context.Err()) {
				return nil
			}
			return err
		}),
	}
}
