package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/autocheckpoint"
	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/fork"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/agent-vm/agent-vm/internal/vm"
	"github.com/agent-vm/agent-vm/internal/wire"
)

func checkpointCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:      "checkpoint",
		Usage:     "keep the VM's workspace and disk as they are now, to roll back to (list, rm)",
		ArgsUsage: "[NAME]",
		Description: "A checkpoint is a copy of the VM's workspace as it is (commits, uncommitted changes,\n" +
			"untracked and ignored files) and of its root disk, kept in the VM's directory under NAME\n" +
			"(default: the time). A running VM is paused for the copy and runs on afterwards.\n" +
			"agent-vm rollback NAME puts it back into the stopped VM. The VM's memory is not kept: after\n" +
			"a rollback it boots afresh. Each checkpoint costs the disk space of its copies\n" +
			"(checkpoint list shows them); destroy removes them with the VM. The qemu backend's VMs\n" +
			"of this machine have checkpoints.",
		Flags: []cli.Flag{vmFlag(),
			&cli.IntFlag{Name: "keep", Usage: "then remove the VM's oldest checkpoints until `N` are left (0: keep them all); with --every, how many automatic ones to keep (0 there: 5)"},
			&cli.StringFlag{Name: "every", Usage: "take none now: from now on the VM's holder takes one every `DURATION` (10m, 1h) while its agent works, named auto-TIME, the newest --keep of them kept (0 stops them)"},
			&cli.BoolFlag{Name: "auto", Usage: "take an automatic checkpoint (auto-TIME), keeping the newest automatic ones as --every set (what the holder runs)"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON: the checkpoint, as checkpoint list --json prints each, with paused_ms, unsynced and pruned"}},
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			if cliCtx.NArg() > 1 {
				return cmdline.Usagef("checkpoint takes at most one NAME, got %d arguments", cliCtx.NArg())
			}
			name, args, err := vmAndArgs(cliCtx, stdio, m, nil)
			if err != nil {
				return err
			}
			if cliCtx.Int("keep") < 0 {
				return cmdline.Usagef("--keep %d: give the number of checkpoints to keep, or 0 for all", cliCtx.Int("keep"))
			}
			if (cliCtx.IsSet("every") || cliCtx.Bool("auto")) && len(args) > 0 || cliCtx.IsSet("every") && cliCtx.Bool("auto") {
				return cmdline.Usagef("--every and --auto name no checkpoint and go without each other (hint: agent-vm checkpoint --every 10m)")
			}
			if cliCtx.IsSet("every") {
				return setSchedule(cliCtx, stdio, m, name)
			}
			var c *fork.Checkpoint
			if cliCtx.Bool("auto") {
				c, err = wire.Forks(m).AutoCheckpoint(cliCtx.Context, name)
			} else {
				c, err = wire.Forks(m).Checkpoint(cliCtx.Context, name, strings.Join(args, ""), cliCtx.Int("keep"))
			}
			if err != nil {
				return err
			}
			if cliCtx.Bool("json") {
				return writeJSON(stdio.Out, struct {
					*fork.Checkpoint
					PausedMS int64    `json:"paused_ms"`
					Unsynced string   `json:"unsynced,omitempty"`
					Pruned   []string `json:"pruned,omitempty"`
				}{c, c.Paused.Milliseconds(), c.Unsynced, c.Pruned})
			}
			fmt.Fprintf(stdio.Out, "checkpoint %s of %s: workspace %d files (%s) at %s, %s\n", c.Name, termsafe.String(name),
				c.Files, workspaceText(*c), shortOr(c.Commit), diskText(c.DiskBytes))
			if c.Paused > 0 {
				fmt.Fprintf(stdio.Out, "  the VM was paused %.1f s for the copy\n", c.Paused.Seconds())
			}
			if len(c.Pruned) > 0 {
				fmt.Fprintf(stdio.Out, "  removed the older checkpoints %s\n", strings.Join(c.Pruned, ", "))
			}
			if c.Unsynced != "" {
				fmt.Fprintf(stdio.Out, "warning: the guest's last writes may be missing from the checkpoint: %s\n", termsafe.String(c.Unsynced))
			}
			fmt.Fprintf(stdio.Out, "back to it: agent-vm stop %s, then agent-vm rollback --vm %s %s\n", name, name, c.Name)
			return nil
		}),
		Subcommands: []*cli.Command{
			{
				Name:         "list",
				Usage:        "the VM's checkpoints, oldest first",
				ArgsUsage:    "[BRANCH]",
				Flags:        []cli.Flag{&cli.BoolFlag{Name: "json", Usage: `print JSON: [{"name", "created_at", "state", "commit", "files", "bytes", "disk_bytes", "skipped", "replaced"}]`}},
				BashComplete: vmCompletion(stdio),
				Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
					name, err := vmName(cliCtx, m)
					if err != nil {
						return err
					}
					cs, err := wire.Forks(m).Checkpoints(cliCtx.Context, name)
					if err != nil {
						return err
					}
					if cliCtx.Bool("json") {
						return writeJSON(stdio.Out, cs)
					}
					printCheckpoints(stdio.Out, name, cs)
					return nil
				}),
			},
			{
				Name:      "rm",
				Usage:     "remove a checkpoint",
				ArgsUsage: "NAME",
				Flags:     []cli.Flag{vmFlag()},
				Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
					if cliCtx.NArg() != 1 {
						return cmdline.Usagef("checkpoint rm takes one NAME, got %d arguments", cliCtx.NArg())
					}
					name, args, err := vmAndArgs(cliCtx, stdio, m, nil)
					if err != nil {
						return err
					}
					if err := wire.Forks(m).RemoveCheckpoint(cliCtx.Context, name, args[0]); err != nil {
						return err
					}
					fmt.Fprintf(stdio.Out, "removed checkpoint %s of %s\n", termsafe.String(args[0]), termsafe.String(name))
					return nil
				}),
			},
		},
	}
}

func rollbackCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:      "rollback",
		Usage:     "put a checkpoint back into the stopped VM: its workspace and disk as they were",
		ArgsUsage: "NAME",
		Description: "The workspace becomes the checkpoint's exactly (files made since are gone, deleted ones\n" +
			"are back, HEAD and the index as they were) and so does the root disk. What the VM had\n" +
			"until then is kept first as a checkpoint of its own (before-rollback-TIME), so a rollback\n" +
			"is undone by another. The VM must be stopped; its next start boots the disk afresh.",
		Flags: []cli.Flag{vmFlag(), &cli.BoolFlag{Name: "json", Usage: "print JSON: branch, slug, to, saved (each a checkpoint)"}},
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			if cliCtx.NArg() != 1 {
				return cmdline.Usagef("rollback takes one checkpoint NAME, got %d arguments (hint: agent-vm checkpoint list)", cliCtx.NArg())
			}
			name, args, err := vmAndArgs(cliCtx, stdio, m, nil)
			if err != nil {
				return err
			}
			res, err := wire.Forks(m).Rollback(cliCtx.Context, name, args[0])
			if err != nil {
				return err
			}
			if cliCtx.Bool("json") {
				return writeJSON(stdio.Out, struct {
					Branch string          `json:"branch"`
					Slug   string          `json:"slug"`
					To     fork.Checkpoint `json:"to"`
					Saved  fork.Checkpoint `json:"saved"`
				}{res.Branch, res.Slug, res.To, res.Saved})
			}
			fmt.Fprintf(stdio.Out, "rolled %s back to checkpoint %s (taken %s, at %s)\n", termsafe.String(res.Branch), res.To.Name,
				res.To.CreatedAt.Local().Format("2006-01-02 15:04:05"), shortOr(res.To.Commit))
			fmt.Fprintf(stdio.Out, "  what it had is checkpoint %s: agent-vm rollback --vm %s %s undoes this\n", res.Saved.Name, res.Slug, res.Saved.Name)
			fmt.Fprintf(stdio.Out, "next: agent-vm start %s\n", res.Slug)
			return nil
		}),
	}
}

// scheduleOf reads the flags every and keep: nil when every is not given,
// else what sets a VM's automatic checkpoints to what they say.
func scheduleOf(cliCtx *cli.Context, m *vm.Manager, every, keep string) (func(ctx context.Context, name string) error, error) {
	if !cliCtx.IsSet(every) {
		return nil, nil
	}
	a, err := autocheckpoint.Parse(cliCtx.String(every), cliCtx.Int(keep))
	if err != nil {
		return nil, cmdline.Usagef("--%s: %v", every, err)
	}
	return func(ctx context.Context, name string) error {
		_, err := wire.Forks(m).Schedule(ctx, name, a)
		return err
	}, nil
}

// setSchedule is checkpoint --every: the VM's schedule set, and said.
func setSchedule(cliCtx *cli.Context, stdio IO, m *vm.Manager, name string) error {
	a, err := autocheckpoint.Parse(cliCtx.String("every"), cliCtx.Int("keep"))
	if err != nil {
		return cmdline.Usagef("--every: %v", err)
	}
	r, err := wire.Forks(m).Schedule(cliCtx.Context, name, a)
	if err != nil {
		return err
	}
	if a != nil {
		fmt.Fprintf(stdio.Out, "VM %s takes a checkpoint every %s while its agent works (while it runs and is not hibernated), keeping the newest %d (auto-TIME; agent-vm checkpoint list %s shows them; --every 0 stops them)\n",
			termsafe.String(r.Branch), autocheckpoint.Every(a), a.Keep, r.Slug)
	} else {
		fmt.Fprintf(stdio.Out, "VM %s takes no automatic checkpoints; those it took stay until checkpoint rm\n", termsafe.String(r.Branch))
	}
	return nil
}

// printCheckpoints is checkpoint list's table.
func printCheckpoints(w io.Writer, vmName string, cs []fork.Checkpoint) {
	if len(cs) == 0 {
		fmt.Fprintf(w, "%s has no checkpoints (agent-vm checkpoint --vm %s NAME takes one)\n", termsafe.String(vmName), termsafe.String(vmName))
		return
	}
	rows := [][]string{{"NAME", "CREATED", "STATE", "COMMIT", "WORKSPACE", "DISK"}}
	var total int64
	for _, c := range cs {
		rows = append(rows, []string{c.Name, c.CreatedAt.Local().Format("2006-01-02 15:04"), c.State, shortOr(c.Commit), workspaceText(c), diskText(c.DiskBytes)})
		total += c.Space + c.DiskBytes
	}
	_ = writeTable(w, rows)
	fmt.Fprintf(w, "%d checkpoints, %s in all\n", len(cs), humanBytes(total))
}

func shortOr(commit string) string {
	if commit == "" {
		return "no commit"
	}
	return short(commit)
}

// workspaceText is the size of a checkpoint's workspace, with how much
// of it is in files other checkpoints share.
func workspaceText(c fork.Checkpoint) string {
	if c.Shared == 0 {
		return humanBytes(c.Bytes)
	}
	return humanBytes(c.Bytes) + ", " + humanBytes(c.Shared) + " shared"
}

func diskText(n int64) string {
	if n == 0 {
		return "no disk yet"
	}
	return "disk " + humanBytes(n)
}
