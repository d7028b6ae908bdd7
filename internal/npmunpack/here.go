package npmunpack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/guest"
)

// NPMExit is InstallHere's error when npm installed the packages and
// exited with a status other than 0 (its output said why).
type NPMExit struct{ Code int }

func (e *NPMExit) Error() string { return fmt.Sprintf("npm install exited with status %d", e.Code) }

// InstallHere installs specs globally on this machine (a guest, as root),
// under prefix ("": npm's configured one): unpacked where Install can,
// saying so on out, else by npm install with the same packages and
// prefix, its output on out and errOut after a line on
// errOut that says why npm.
func InstallHere(ctx context.Context, prefix string, specs []string, out, errOut io.Writer) error {
	npm, _ := exec.LookPath("npm")
	cfg, err := ReadConfig(os.Environ(), npm)
	if err != nil {
		return err
	}
	goos, cpu, libc := ThisMachine()
	u := Unpacker{Prefix: prefix, Config: cfg, OS: goos, CPU: cpu, Libc: libc}
	if u.Prefix == "" {
		u.Prefix = cfg.Prefix
	}
	done, err := u.Install(ctx, specs)
	for _, in := range done {
		fmt.Fprintf(out, "unpacked %s@%s in %s (nothing else to do: npm not run)\n", in.Name, in.Version, in.Dir)
	}
	if !errors.Is(err, ErrNeedsNPM) {
		return err
	}
	fmt.Fprintf(errOut, "%v\n", err)
	argv := guest.NPMCommand(prefix, specs...)
	res, err := execx.OS{}.Run(ctx, execx.Cmd{Path: argv[0], Args: argv[1:], Stdout: out, Stderr: errOut})
	if res.ExitCode != 0 {
		return &NPMExit{Code: res.ExitCode}
	}
	return err
}
