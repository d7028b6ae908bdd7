package cli

import (
	"os"

	"github.com/hashicorp/go-hclog"
	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/vm"
	"github.com/agent-vm/agent-vm/internal/wire"
)

// env is what a command's action works with.
type env struct {
	g     globals
	log   hclog.Logger
	stdio IO
}

func newEnv(cliCtx *cli.Context, stdio IO) *env {
	g := parseGlobals(cliCtx, stdio)
	return &env{g: g, log: newLogger(g, stdio.Err), stdio: stdio}
}

// manager opens the state directory through vm's composition root, which
// knows the backends: the CLI does not.
func (e *env) manager() (*vm.Manager, error) {
	wd, _ := os.Getwd() // "" (outside any repository) if it is gone
	return wire.Open(wire.Config{StateDir: e.g.stateDir, WorkDir: wd, Getenv: e.stdio.Getenv, Log: e.log, Progress: e.stdio.Err})
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
