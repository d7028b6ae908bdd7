package mcpproxy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// resolveCommand finds the program a server runs: with PATH from the server's
// env when it sets one (as a client launching it would), else the proxy's.
func resolveCommand(srv Server) (string, error) {
	if srv.Problem != "" {
		return "", errors.New(srv.Problem)
	}
	cmd := srv.Command
	if strings.Contains(cmd, "/") {
		p := cmd
		if !filepath.IsAbs(p) {
			base := srv.Dir
			if base == "" {
				wd, err := os.Getwd()
				if err != nil {
					return "", err
				}
				base = wd
			}
			p = filepath.Join(base, p)
		}
		if err := checkExecutable(p); err != nil {
			return "", fmt.Errorf("command %s: %w", cmd, err)
		}
		return p, nil
	}
	pathEnv, ok := srv.Env["PATH"]
	if !ok {
		pathEnv = os.Getenv("PATH")
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue // never run a program from a relative PATH entry
		}
		p := filepath.Join(dir, cmd)
		if checkExecutable(p) == nil {
			return p, nil
		}
	}
	hint := "install it in the VM, or give its absolute path"
	if strings.ContainsAny(cmd, " \t") {
		hint = `put its arguments in "args", not in "command"`
	}
	return "", fmt.Errorf("command %q not found on PATH (hint: %s)", cmd, hint)
}

func checkExecutable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return errors.New("no such file")
		}
		return err
	}
	if !st.Mode().IsRegular() {
		return errors.New("not a regular file")
	}
	if st.Mode().Perm()&0o111 == 0 || syscall.Access(p, 1 /* X_OK */) != nil {
		return fmt.Errorf("not executable (hint: chmod +x %s)", p)
	}
	return nil
}
