package cli

import (
	"os"

	"github.com/hashicorp/go-hclog"
	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/vm"
	"github.com/agent-vm/agent-vm/internal/wire"
)

// env is what a command's action works with.
type env struct {
	stateDir string
	log      hclog.Logger
	stdio    IO
}

func newEnv(cliCtx *cli.Context, stdio IO) *env {
	return &env{stateDir: stateDir(cliCtx, stdio), log: cmdline.Logger(cliCtx, stdio), stdio: stdio}
}

// manager opens the state directory through vm's composition root, which
// knows the backends: the CLI does not.
func (e *env) manager() (*vm.Manager, error) {
	wd, _ := os.Getwd() // "" (outside any repository) if it is gone
	return wire.Open(wire.Config{StateDir: e.stateDir, WorkDir: wd, Getenv: e.stdio.Getenv, Log: e.log, Progress: e.stdio.Err})
}

func hasFlag(c *cli.Command, name string) bool {
	for _, f := range c.Flags {
		for _, n := range f.Names() {
			if n == name {
				return true
			}
		}
	}
	return false
}
