package vagrant

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
)

// UserFile, in a machine's project directory, says that the machine runs
// the repository's own Vagrantfile as is (see the package doc, "The
// repository's own Vagrantfile"); without it the machine's Vagrantfile is
// agent-vm's, in the project directory.
const UserFile = "user-vagrantfile.json"

// UserProject is a machine run from the repository's own Vagrantfile.
type UserProject struct {
	// Vagrantfile is the file's absolute path (VAGRANT_VAGRANTFILE), in
	// the user's repository on the host, which the guest cannot write.
	Vagrantfile string `json:"vagrantfile"`
	// Dir is VAGRANT_CWD, the directory the Vagrantfile's relative paths
	// (synced folders, provisioning scripts) resolve against: the VM's
	// workspace, through its UserRoot symlink.
	Dir string `json:"dir"`
	// Machine is the one machine the Vagrantfile defines.
	Machine string `json:"machine"`
}

// ErrNotUsable is a repository Vagrantfile agent-vm will not run.
var ErrNotUsable = errors.New("the repository's Vagrantfile cannot be used")

// FindUserVagrantfile looks for a Vagrantfile at the root of repo (an
// absolute path). ok is false when there is none. A Vagrantfile that is a
// directory, or a symlink that leads out of the repository or nowhere, is
// ErrNotUsable, with the fix: agent-vm evaluates the file (Ruby, on the
// host) at every vagrant command, so it runs only a file the repository
// itself holds. The path returned has its symlinks resolved.
func FindUserVagrantfile(repo string) (path string, ok bool, err error) {
	p := filepath.Join(repo, "Vagrantfile")
	fi, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	fix := "(hint: pass --vagrantfile=generate to use agent-vm's own Vagrantfile instead)"
	if fi.Mode()&os.ModeSymlink != 0 {
		root, rerr := filepath.EvalSymlinks(repo)
		target, terr := filepath.EvalSymlinks(p)
		if err := errors.Join(rerr, terr); err != nil {
			return "", false, fmt.Errorf("%w: %s is a symlink that leads nowhere: %v %s", ErrNotUsable, p, err, fix)
		}
		if rel, err := filepath.Rel(root, target); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			return "", false, fmt.Errorf("%w: %s is a symlink to %s, outside the repository; agent-vm runs only a Vagrantfile the repository holds (hint: copy the file into the repository, or pass --vagrantfile=generate)", ErrNotUsable, p, target)
		}
		p = target
		if fi, err = os.Stat(p); err != nil {
			return "", false, err
		}
	}
	if !fi.Mode().IsRegular() {
		return "", false, fmt.Errorf("%w: %s is a %s, not a file %s", ErrNotUsable, p, kind(fi.Mode()), fix)
	}
	return p, true, nil
}

func kind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&os.ModeNamedPipe != 0:
		return "named pipe"
	case m&os.ModeSocket != 0:
		return "socket"
	case m&os.ModeDevice != 0:
		return "device"
	}
	return "special file"
}

// UserRoot is the VAGRANT_CWD of a machine of the repository's own
// Vagrantfile: a symlink in the project directory, named after the machine
// (UniqueName), to the VM's workspace. Not the workspace's own path:
// vagrant-libvirt names the libvirt domain <basename of VAGRANT_CWD>_<machine>
// (unless the file sets default_prefix), and every VM's workspace is called
// "workspace", so two VMs would both want the domain workspace_default.
// vagrant does not resolve the symlink (it expands VAGRANT_CWD, no more),
// so the domain is <name>_<machine>, and the file's "." is the workspace.
func UserRoot(runDir, name string) string { return filepath.Join(Project(runDir), name) }

// LinkUserRoot makes UserRoot(runDir, name) point at workspace, replacing
// a link that points elsewhere.
func LinkUserRoot(runDir, name, workspace string) error {
	link := UserRoot(runDir, name)
	if cur, err := os.Readlink(link); err == nil && cur == workspace {
		return nil
	}
	if err := os.MkdirAll(Project(runDir), 0o700); err != nil {
		return err
	}
	_ = os.Remove(link)
	if err := os.Symlink(workspace, link); err != nil {
		return fmt.Errorf("linking the vagrant project directory to the workspace: %w", err)
	}
	return nil
}

// WriteUser records in runDir's project directory that the machine runs u.
func WriteUser(runDir string, u UserProject) error {
	if err := os.MkdirAll(Project(runDir), 0o700); err != nil {
		return err
	}
	return atomicfile.WriteJSON(filepath.Join(Project(runDir), UserFile), u, 0o600)
}

// userOf reads the UserFile of m; ok is false for a machine of agent-vm's
// own Vagrantfile.
func userOf(m driver.Machine) (UserProject, bool, error) {
	var u UserProject
	err := readJSON(filepath.Join(Project(m.RunDir), UserFile), &u)
	if errors.Is(err, os.ErrNotExist) {
		return u, false, nil
	}
	if err == nil && (u.Vagrantfile == "" || u.Dir == "" || u.Machine == "") {
		err = fmt.Errorf("%s is incomplete: %+v", UserFile, u)
	}
	return u, err == nil, err
}

// UserEnv is the environment of vagrant commands on u: VAGRANT_CWD and
// VAGRANT_VAGRANTFILE are the user's, the machine state (dotDir) and
// VAGRANT_HOME stay agent-vm's, so the repository's own .vagrant/ is never
// used. No VAGRANT_DEFAULT_PROVIDER: the Vagrantfile (or the user's
// environment) chooses the provider.
func UserEnv(u UserProject, dotDir, home string) []string {
	env := []string{"VAGRANT_CWD=" + u.Dir, "VAGRANT_VAGRANTFILE=" + u.Vagrantfile, "VAGRANT_DOTFILE_PATH=" + dotDir,
		"VAGRANT_CHECKPOINT_DISABLE=1"}
	if home != "" {
		env = append(env, "VAGRANT_HOME="+home)
	}
	return env
}

// UserMachines runs `vagrant status --machine-readable` on u (its Machine
// unset) and returns the machines its Vagrantfile defines, in order.
func UserMachines(ctx context.Context, run execx.Runner, u UserProject, dotDir, home string) ([]string, error) {
	res, err := run.Run(ctx, execx.Cmd{Path: "vagrant", Args: []string{"status", "--machine-readable"}, Dir: u.Dir, Env: UserEnv(u, dotDir, home)})
	if err != nil {
		return nil, fmt.Errorf("reading the machines of %s with `vagrant status`: %w (hint: `vagrant validate` in the repository shows what is wrong, or pass --vagrantfile=generate)", u.Vagrantfile, err)
	}
	var names []string
	for _, l := range ParseMachineReadable(res.Stdout) {
		if l.Type == "error-exit" {
			return nil, fmt.Errorf("vagrant could not read %s: %s", u.Vagrantfile, strings.Join(l.Data[min(1, len(l.Data)):], ","))
		}
		if l.Type == "metadata" && l.Target != "" && len(l.Data) > 0 && l.Data[0] == "provider" {
			names = append(names, l.Target)
		}
	}
	return names, nil
}

// OneMachine checks that the Vagrantfile defines exactly one machine and
// returns it. Several are refused rather than the `primary` one picked:
// agent-vm runs one VM per branch, and starting, stopping and destroying
// one machine of several would leave the others' lifecycle to nobody
// (while `vagrant up` with no name would start them all); vagrant's
// machine-readable status does not say which one is primary either.
func OneMachine(path string, names []string) (string, error) {
	switch len(names) {
	case 1:
		return names[0], nil
	case 0:
		return "", fmt.Errorf("%w: vagrant found no machine in %s (hint: pass --vagrantfile=generate)", ErrNotUsable, path)
	}
	return "", fmt.Errorf("%w: %s defines %d machines (%s), and agent-vm runs one machine per branch (hint: keep one machine in the Vagrantfile, or pass --vagrantfile=generate to use agent-vm's own)", ErrNotUsable, path, len(names), strings.Join(names, ", "))
}
