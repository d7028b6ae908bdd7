package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/agent"
	"github.com/agent-vm/agent-vm/internal/autocheckpoint"
	"github.com/agent-vm/agent-vm/internal/browser"
	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/session"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// chromeFlag is run's and attach's --chrome.
var chromeFlag = &cli.BoolFlag{Name: "chrome", Usage: "let the agent (Claude Code) use the host's Chrome: tunnel Claude in Chrome's bridge, else fall back to a DevTools endpoint on 127.0.0.1:9222 (see agent-vm browser)"}

func runCommand(stdio IO) *cli.Command {
	flags := []cli.Flag{
		&cli.StringFlag{Name: "agent", Usage: "run agent `NAME`: claude, codex or gemini (its CLI is installed first if the VM lacks it), or any program in the VM (default: the VM's, from create --agent)"},
		&cli.StringSliceFlag{Name: "env", Aliases: []string{"e"}, Usage: "NAME (its value from your environment) or NAME=VALUE, passed to the agent only (repeatable); a credential is better kept on the host: see agent-vm secret set"},
		sessionFlag("start or attach to the agent session `NAME` (default: named after the agent)"),
		&cli.BoolFlag{Name: "new", Usage: "start another session even if one runs"},
		chromeFlag,
		&cli.StringFlag{Name: "on-wait", Usage: "run shell command `CMD` on this host whenever an agent of the VM starts waiting for you, until the VM stops (default: on_wait in ~/.config/agent-vm/config.toml); it gets AGENT_VM_BRANCH, AGENT_VM_SESSION, AGENT_VM_STATE and AGENT_VM_MESSAGE"},
		&cli.StringFlag{Name: "checkpoint-every", Usage: "take a checkpoint of the VM every `DURATION` (10m, 1h) while its agent works, kept in the VM's record (0 stops them; see agent-vm checkpoint --every)"},
		&cli.IntFlag{Name: "checkpoint-keep", Value: autocheckpoint.DefaultKeep, Usage: "with --checkpoint-every: keep the newest `N` automatic checkpoints"},
		timeoutFlag(bootTimeout),
	}
	return &cli.Command{
		Name:      "run",
		Usage:     "run an agent in the branch's VM (made and started if need be) and attach to it",
		ArgsUsage: "[BRANCH] [-- ARGS...]",
		Description: "Attaches your terminal to the agent, which runs as the guest user in /workspace inside a\n" +
			"session that outlives the connection: detach with Ctrl-b d (or close the terminal), come back\n" +
			"with agent-vm attach. Running it again re-attaches to the same session. Secrets given with\n" +
			"--env reach the agent's environment only: never the VM's disk, its record or the logs; but\n" +
			"the agent can read them, and agent-vm secret set keeps a credential on the host instead.\n" +
			"A branch without a VM gets one, made with the create flags below.",
		Flags:        append(flags, createFlags()...),
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			before, args := splitDashes(cliCtx)
			if len(before) > 1 {
				return cmdline.Usagef("run takes one BRANCH, got %q (hint: the agent's arguments go after --: agent-vm run %s -- %s)", before, before[0], strings.Join(before[1:], " "))
			}
			name := ""
			if len(before) == 1 {
				name = before[0]
			}
			if name == "" {
				var err error
				if name, err = currentBranch(cliCtx, m); err != nil {
					return err
				}
			}
			co, err := createOptions(cliCtx)
			if err != nil {
				return err
			}
			co.Agent = "" // run's --agent is what runs; agent.Run installs a known one
			if err := m.Host.Prepare(cliCtx.Context); err != nil {
				return err
			}
			p := newProgress(stdio.Err)
			so := vm.StartOptions{Timeout: cliCtx.Duration("timeout"), Report: p.reporter(), Nixpkgs: cliCtx.String("nixpkgs")}
			notify := func(s string) {
				p.done()
				fmt.Fprintf(stdio.Err, "agent-vm: %s\n", s)
			}
			o := agent.RunOptions{
				Name: name, Agent: cliCtx.String("agent"), Args: args, Env: cliCtx.StringSlice("env"),
				Session: cliCtx.String("session"), New: cliCtx.Bool("new"), Getenv: stdio.Getenv,
				Term: agent.Terminal{In: stdio.In, Out: stdio.Out, Err: stdio.Err}, Notify: notify, Chrome: cliCtx.Bool("chrome"),
				OnWait: cliCtx.String("on-wait"), Log: m.Log,
			}
			prov := &runProvisioner{m: m, create: co, start: so, getenv: stdio.Getenv, notify: notify}
			if prov.schedule, err = scheduleOf(cliCtx, m, "checkpoint-every", "checkpoint-keep"); err != nil {
				return err
			}
			res, err := agent.Run(cliCtx.Context, m, prov, o)
			p.done()
			return sessionEnd(res, err)
		}),
	}
}

// splitDashes splits a command's positional arguments at the "--" the user
// typed: urfave/cli drops a "--" that directly follows the flags but keeps
// one after a positional argument, so the raw command line decides.
func splitDashes(cliCtx *cli.Context) (before, after []string) {
	args := cliCtx.Args().Slice()
	raw := cmdline.RawArgs(cliCtx)
	for j, a := range raw {
		if a != "--" {
			continue
		}
		n := len(raw) - j - 1 // typed after "--"
		if n > len(args) {
			n = len(args)
		}
		before, after = args[:len(args)-n], args[len(args)-n:]
		if len(before) > 0 && before[len(before)-1] == "--" {
			before = before[:len(before)-1]
		}
		return before, after
	}
	return args, nil
}

// sessionEnd turns a session's end into agent-vm's: the agent's exit status
// when it ended, 0 when the user detached.
func sessionEnd(res *agent.Result, err error) error {
	if err != nil {
		return err
	}
	if res.Exited && res.Status != 0 {
		code := res.Status
		if code < 0 {
			code = 1
		}
		return cmdline.ExitStatus(code)
	}
	return nil
}

// sessionFlag is --session NAME, the one way a command names an agent
// session (run, attach, logs, sessions rm); usage says what it does there
// and holds the placeholder `NAME`.
func sessionFlag(usage string) *cli.StringFlag {
	return &cli.StringFlag{Name: "session", Usage: usage}
}

func attachCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:         "attach",
		Usage:        "attach the terminal to an agent session (detach: Ctrl-b d)",
		ArgsUsage:    "[BRANCH]",
		Flags:        []cli.Flag{sessionFlag("attach to the agent session `NAME` (default: the VM's only session)"), chromeFlag},
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			if cliCtx.NArg() > 2 || cliCtx.NArg() == 2 && cliCtx.IsSet("session") {
				return cmdline.Usagef("attach takes at most one BRANCH, got %d arguments (hint: name the session with --session NAME)", cliCtx.NArg())
			}
			name, sess := cliCtx.Args().Get(0), cliCtx.String("session")
			if cliCtx.NArg() == 2 {
				sess = cliCtx.Args().Get(1)
				fmt.Fprintf(stdio.Err, "agent-vm: attach BRANCH SESSION is deprecated; write attach %s --session %s\n", name, sess)
			}
			if name == "" {
				var err error
				if name, err = currentBranch(cliCtx, m); err != nil {
					return err
				}
			}
			notify := func(s string) { fmt.Fprintf(stdio.Err, "agent-vm: %s\n", s) }
			if cliCtx.Bool("chrome") {
				// The session runs already: its agent keeps the flags it
				// started with; the bridge to the host's Chrome is what attach can open.
				if _, err := browser.ForAgent(cliCtx.Context, m, name, stdio.Getenv, notify); err != nil {
					return err
				}
			}
			res, err := agent.Attach(cliCtx.Context, m, agent.AttachOptions{Name: name, Session: sess,
				Term: agent.Terminal{In: stdio.In, Out: stdio.Out, Err: stdio.Err}, Notify: notify})
			return sessionEnd(res, err)
		}),
	}
}

func sessionsCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:         "sessions",
		Usage:        "list the agent sessions of a VM",
		ArgsUsage:    "[BRANCH]",
		Flags:        []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			name, err := vmName(cliCtx, m)
			if err != nil {
				return err
			}
			infos, err := agent.Sessions(cliCtx.Context, m, name)
			if err != nil {
				return err
			}
			if cliCtx.Bool("json") {
				if infos == nil {
					infos = []session.Info{}
				}
				return writeJSON(stdio.Out, infos)
			}
			if len(infos) == 0 {
				fmt.Fprintf(stdio.Out, "no agent sessions (agent-vm run %s starts one)\n", name)
				return nil
			}
			rows := [][]string{{"SESSION", "COMMAND", "STARTED", "STATE", "AGENT"}}
			for _, in := range infos {
				rows = append(rows, []string{in.Name, termsafe.Truncate(termsafe.String(in.Command), 50),
					in.Started.Local().Format(time.DateTime), in.Running(), termsafe.Truncate(termsafe.String(in.Doing(time.Now())), 70)})
			}
			return writeTable(stdio.Out, rows)
		}),
		Subcommands: []*cli.Command{{
			Name:      "rm",
			Usage:     "remove a session (one whose agent still runs only with --force)",
			ArgsUsage: "[BRANCH] --session NAME",
			Flags: []cli.Flag{sessionFlag("remove the agent session `NAME` (required)"),
				&cli.BoolFlag{Name: "force", Usage: "end a running agent (it gets SIGHUP)"}},
			Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
				var name, sess string
				switch {
				case cliCtx.NArg() == 2 && !cliCtx.IsSet("session"):
					name, sess = cliCtx.Args().Get(0), cliCtx.Args().Get(1)
					fmt.Fprintf(stdio.Err, "agent-vm: sessions rm BRANCH SESSION is deprecated; write sessions rm %s --session %s\n", name, sess)
				case !cliCtx.IsSet("session"):
					return cmdline.Usagef("sessions rm needs --session NAME (hint: agent-vm sessions [BRANCH] lists them)")
				default:
					var err error
					if name, err = vmName(cliCtx, m); err != nil {
						return err
					}
					sess = cliCtx.String("session")
				}
				if err := agent.Remove(cliCtx.Context, m, name, sess, cliCtx.Bool("force")); err != nil {
					return err
				}
				fmt.Fprintf(stdio.Out, "removed session %s\n", sess)
				return nil
			}),
		}},
	}
}
