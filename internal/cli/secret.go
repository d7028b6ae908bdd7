package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/secret"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// secretCommand is `secret set|list|rm`: the host's store of the
// credentials agents use (internal/secret).
func secretCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:  "secret",
		Usage: "credentials kept on the host, which the VMs' egress proxies put into requests (set, list, rm)",
		Description: "A secret is a value with a name (an environment variable's, e.g. ANTHROPIC_API_KEY), the hosts\n" +
			"it is sent to, and the VMs it is for (every VM, or one with --vm). It stays on the host, in\n" +
			"$XDG_CONFIG_HOME/agent-vm/secrets (~/.config/agent-vm/secrets), 0600: each VM it is for gets a\n" +
			"placeholder in its environment, and the VM's egress proxy puts the value in place of the\n" +
			"placeholder on HTTPS requests to the secret's hosts, where a credential goes: the Authorization\n" +
			"header (the placeholder alone, after a scheme, or as a Basic user or password) and the headers\n" +
			"named with --header (x-api-key for ANTHROPIC_API_KEY). A placeholder anywhere else in a request\n" +
			"is refused, since a server may send the rest of a request back. A change applies at a VM's next start;\n" +
			"a running VM keeps what it started with. No command prints a value.",
		Subcommands: []*cli.Command{
			{
				Name:      "set",
				Usage:     "store a secret, its value read from standard input (or typed at a prompt that does not echo it)",
				ArgsUsage: "NAME",
				Flags: []cli.Flag{
					&cli.StringSliceFlag{Name: "host", Usage: "send the value to `HOST` only (repeatable; default: the API's hosts for a well-known NAME such as ANTHROPIC_API_KEY or GH_TOKEN)"},
					&cli.StringSliceFlag{Name: "header", Usage: "send the value in request header `NAME` too, besides Authorization (repeatable; x-api-key for ANTHROPIC_API_KEY and x-goog-api-key for GEMINI_API_KEY without asking)"},
					&cli.StringFlag{Name: "vm", Usage: "for the VM of `BRANCH` only (default: every VM)"},
				},
				Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error { return secretSet(cliCtx, stdio, m) }),
			},
			{
				Name:    "list",
				Aliases: []string{"ls"},
				Usage:   "list the secrets: name, hosts, the headers their value goes in, and VM; never the value",
				Flags:   []cli.Flag{&cli.BoolFlag{Name: "json", Usage: `print JSON: [{"name", "hosts", "headers", "vm", "vm_id"}]`}},
				Action:  withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error { return secretList(cliCtx, stdio, m) }),
			},
			{
				Name:      "rm",
				Usage:     "remove a secret",
				ArgsUsage: "NAME",
				Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
					name, err := secretName(cliCtx)
					if err != nil {
						return err
					}
					if err := m.Secrets.Remove(name); err != nil {
						return err
					}
					fmt.Fprintf(stdio.Out, "removed secret %s (running VMs keep it until they stop)\n", name)
					return nil
				}),
			},
		},
	}
}

// secretSet is `secret set NAME [--host HOST]... [--header NAME]... [--vm BRANCH]`: all that
// was typed is checked before the value is read.
func secretSet(cliCtx *cli.Context, stdio IO, m *vm.Manager) error {
	name, err := secretName(cliCtx)
	if err != nil {
		return err
	}
	if err := secret.CheckName(name); err != nil {
		return err
	}
	hosts, err := secret.Hosts(name, cliCtx.StringSlice("host"))
	if err != nil {
		return fmt.Errorf("--host: %w", err)
	}
	if len(hosts) == 0 {
		return cmdline.Usagef("secret %s needs the hosts its value is sent to: agent-vm knows none for that name (hint: `agent-vm secret set %s --host HOST`, e.g. --host api.example.com; repeat --host for more)", name, name)
	}
	sec := secret.Secret{Name: name, Hosts: hosts}
	for _, h := range cliCtx.StringSlice("header") {
		c, err := secret.CheckHeader(h)
		if err != nil {
			return cmdline.Usagef("secret set %s --header: %v", name, err)
		}
		if !slices.Contains(sec.Headers, c) {
			sec.Headers = append(sec.Headers, c)
		}
	}
	scope := "for every VM; it takes effect when a VM next starts (running VMs keep what they started with)"
	if branch := cliCtx.String("vm"); branch != "" {
		if sec.VM, branch, err = containedVM(cliCtx.Context, m, branch, name); err != nil {
			return err
		}
		scope = fmt.Sprintf("for VM %s only; it takes effect when the VM next starts (if it runs, it keeps what it started with)", branch)
	}
	if sec.Value, err = readValue(cliCtx.Context, stdio, name); err != nil {
		return err
	}
	verb := "stored"
	if _, err := m.Secrets.Get(name); !errors.Is(err, secret.ErrNotFound) {
		verb = "replaced"
	}
	if err := m.Secrets.Set(sec); err != nil {
		return err
	}
	where := "Authorization"
	if c := sec.Carriers(); len(c) > 0 {
		where += " or " + strings.Join(c, ", ")
	}
	fmt.Fprintf(stdio.Out, "%s secret %s, sent to %s only, in %s, %s\n", verb, name, strings.Join(hosts, ", "), where, scope)
	return nil
}

// secretName is the NAME argument of secret set and rm. The arguments
// are never quoted: one may be a value.
func secretName(cliCtx *cli.Context) (string, error) {
	verb := cliCtx.Command.Name
	hint, fix := "`agent-vm secret list` shows the stored ones", "`agent-vm secret rm %s`"
	if verb == "set" {
		hint, fix = "the value comes on standard input, e.g. `printenv NAME | agent-vm secret set NAME`", "`printenv %s | agent-vm secret set %[1]s`, or type the value at the prompt"
	}
	if cliCtx.NArg() != 1 {
		return "", cmdline.Usagef("secret %s takes one NAME, got %d arguments (hint: %s)", verb, cliCtx.NArg(), hint)
	}
	name := cliCtx.Args().First()
	if before, _, ok := strings.Cut(name, "="); ok {
		return "", cmdline.Usagef("secret %s takes NAME alone, never a value (hint: %s)", verb, fmt.Sprintf(fix, termsafe.String(before)))
	}
	return name, nil
}

// containedVM is the record id and branch of the VM branch names, which
// must be network-contained: its egress proxy is what holds a secret.
func containedVM(ctx context.Context, m *vm.Manager, branch, name string) (id, shown string, err error) {
	e, err := m.Recorded(ctx, branch)
	if err != nil {
		return "", "", err
	}
	shown = termsafe.String(e.Record.Branch)
	if !m.Contains(e.Record) {
		return "", "", fmt.Errorf("VM %s's network is not contained (it runs the repository's own Vagrantfile): no egress proxy can hold the secret for it (hint: secrets are for VMs agent-vm sets up, created with --vagrantfile=generate on the vagrant backend; this VM's agent can get the value only in its environment, with `agent-vm run %s --env %s`)",
			shown, shown, name)
	}
	return e.Record.ID, shown, nil
}

// readValue reads the secret's value from standard input: as it comes
// from a pipe or a file, or typed at a prompt that does not echo it.
// Ctrl-C at the prompt gives the terminal back as it was.
func readValue(ctx context.Context, stdio IO, name string) (secret.Value, error) {
	if stdio.In == nil {
		return secret.ReadValue(strings.NewReader(""))
	}
	fd := int(stdio.In.Fd())
	if !term.IsTerminal(fd) {
		return secret.ReadValue(stdio.In)
	}
	old, err := term.GetState(fd)
	if err != nil {
		return secret.Value{}, fmt.Errorf("reading the secret's value: %w", err)
	}
	fmt.Fprintf(stdio.Err, "value of %s (not echoed): ", name)
	type typed struct {
		b   []byte
		err error
	}
	done := make(chan typed, 1)
	go func() {
		b, err := term.ReadPassword(fd)
		done <- typed{b, err}
	}()
	select {
	case <-ctx.Done():
		term.Restore(fd, old)
		fmt.Fprintln(stdio.Err)
		return secret.Value{}, ctx.Err()
	case t := <-done:
		fmt.Fprintln(stdio.Err)
		if t.err != nil {
			return secret.Value{}, fmt.Errorf("reading the secret's value: %w", t.err)
		}
		return secret.ReadValue(bytes.NewReader(t.b))
	}
}

// secretRow is a secret as list shows it: never its value.
type secretRow struct {
	Name    string   `json:"name"`
	Hosts   []string `json:"hosts"`
	Headers []string `json:"headers"` // besides Authorization (Secret.Carriers)
	VM      string   `json:"vm"`      // the branch of the VM it is for, if that VM exists
	VMID    string   `json:"vm_id"`   // its record's id; "" for every VM
}

// secretList is `secret list [--json]`. A damaged secret file is an
// error after the others are listed.
func secretList(cliCtx *cli.Context, stdio IO, m *vm.Manager) error {
	if err := cmdline.NoArgs(cliCtx); err != nil {
		return err
	}
	all, listErr := m.Secrets.List()
	entries, err := m.List(cliCtx.Context)
	if err != nil {
		return err
	}
	branches := map[string]string{} // by record id
	for _, en := range entries {
		if en.Record != nil {
			branches[en.Record.ID] = en.Record.Branch
		}
	}
	rows := []secretRow{}
	for _, s := range all {
		headers := append([]string{"authorization"}, s.Carriers()...)
		rows = append(rows, secretRow{Name: s.Name, Hosts: s.Hosts, Headers: headers, VM: branches[s.VM], VMID: s.VM})
	}
	if cliCtx.Bool("json") {
		return errors.Join(writeJSON(stdio.Out, rows), listErr)
	}
	if len(rows) == 0 && listErr == nil {
		fmt.Fprintln(stdio.Out, "no secrets (hint: `printenv NAME | agent-vm secret set NAME` stores one)")
		return nil
	}
	table := [][]string{{"NAME", "HOSTS", "HEADERS", "VM"}}
	for _, r := range rows {
		vmCell := termsafe.String(r.VM)
		switch {
		case r.VMID == "":
			vmCell = "(all VMs)"
		case r.VM == "":
			vmCell = "(VM gone: " + termsafe.String(r.VMID) + ")"
		}
		table = append(table, []string{r.Name, strings.Join(r.Hosts, ","), strings.Join(r.Headers, ","), vmCell})
	}
	return errors.Join(writeTable(stdio.Out, table), listErr)
}
