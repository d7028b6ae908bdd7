package hostlink

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// Placing VMs on a host runs agent-vm's own binary there (the egress proxy,
// the virtiofsd jail). Install copies it over the link, named by its
// content as the qemu backend names its local copy of the relay, so hosts
// never need it installed by hand and two versions of agent-vm can use one
// host side by side.
//
// Every remote step is a command run through sshx.Run with its arguments
// quoted by sshx.Quote; the few that need a shell's logic run under
// `sh -c`, so the login user's shell does not matter. Nothing here uses
// scp or SFTP: the host needs a POSIX sh, coreutils and pgrep, no more.

// Installed is agent-vm's binary as Install left it on a host.
type Installed struct {
	Path   string `json:"path"`   // the binary on the host
	SHA256 string `json:"sha256"` // hex
	Copied bool   `json:"copied"` // false: it was there already
}

const copyPrefix = "agent-vm-"

var (
	// copyName is a copy's name: copyPrefix and the first 16 hex of its
	// sha256. Nothing else in the directory is ever removed, save tmpName.
	copyName = regexp.MustCompile(`^agent-vm-[0-9a-f]{16}$`)
	// tmpName is a copy being written (or left by an upload cut short).
	tmpName = regexp.MustCompile(`^\.agent-vm-[0-9a-f]{16}\.[0-9a-f]{16}\.tmp$`)
)

// AgentKeep is how long a copy of agent-vm's binary in a host's agent-vm
// directory that no process runs is kept before another version's
// InstallAgent prunes it: longer than an upload, and than the time from an
// install to starting what it installed.
const AgentKeep = 10 * time.Minute

// InstallAgent is Install of agent-vm's own binary src into the bin
// directory of agent-vm's directory dir on the host.
func InstallAgent(ctx context.Context, c *ssh.Client, src, dir string) (Installed, error) {
	return Install(ctx, c, src, path.Join(dir, "bin"), AgentKeep)
}

// ErrUnreachable marks DialAgent's failure to open the link at all (the
// host down or gone, its sshd refusing agent-vm's key or showing another
// host key), as against a failure on a host that answered.
var ErrUnreachable = errors.New("the host cannot be reached over agent-vm's link")

// DialAgent opens the link to t and makes sure agent-vm's binary exe (a
// local file) is in agent-vm's directory dir on the host (InstallAgent),
// returning the connection and the binary's path there. Older copies that
// could not be pruned are only reported to warn: the binary is in place.
func DialAgent(ctx context.Context, t Target, exe, dir string, warn func(error)) (*ssh.Client, string, error) {
	c, err := Dial(ctx, t)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	inst, err := InstallAgent(ctx, c, exe, dir)
	if inst.Path == "" {
		c.Close()
		return nil, "", fmt.Errorf("copying agent-vm's binary to %s: %w", t.Addr, err)
	}
	if err != nil && warn != nil {
		warn(err)
	}
	return c, inst.Path, nil
}

// Install copies the local file src (agent-vm's binary) to dir on the host
// over c, as dir/agent-vm-<first 16 hex of its sha256>, mode 0755, owned by
// the login user, unless a regular file of the login user's by that name and
// with that sha256 is there already (then nothing is copied: Copied is
// false, and only its mode is set again).
//
// dir must be absolute and not a symbolic link, owned by the login user and
// writable by no one else; it is made 0700 if missing (mkdir -p). The copy
// goes to a temporary name in dir (cat > tmp), is checked with sha256sum on
// the host, made 0755, then renamed over the name (mv -f), so a concurrent
// Install or a reader never sees half a file; all of that is one command,
// one SSH session.
//
// Then the other copies (and temporary files) in dir that were last
// installed keep or longer ago and that no process on the host runs are
// removed. "Runs" is `pgrep -f`: a process whose command line names the
// copy's path. That is how agent-vm starts it (by its full path; a script
// run by its interpreter is named in the interpreter's arguments too), and
// every user's command lines are readable where fuser would need root to
// see another user's executables. "Last installed" is the copy's ctime,
// which the chmod before the rename sets and the chmod of a copy found in
// place renews, so a copy one agent-vm has just found is not pruned by
// another before it starts it; its mtime stays the copy's. keep should
// outlast an upload and the time from an Install to starting what it
// installed (the qemu backend keeps its relay copies 10 minutes). A
// failure to prune is returned with the Installed filled in: the binary
// is in place.
func Install(ctx context.Context, c *ssh.Client, src, dir string, keep time.Duration) (Installed, error) {
	if !path.IsAbs(dir) {
		return Installed{}, fmt.Errorf("installing agent-vm's binary on %s: the directory %q is not an absolute path (hint: give the full path, e.g. /var/lib/agent-vm/bin)", c.RemoteAddr(), dir)
	}
	dir = path.Clean(dir)
	f, sum, err := openBinary(src)
	if err != nil {
		return Installed{}, err
	}
	defer f.Close()
	inst := Installed{Path: path.Join(dir, copyPrefix+sum[:16]), SHA256: sum}
	r := remote{ctx: ctx, c: c}
	wrap := func(err error) error {
		return fmt.Errorf("installing agent-vm's binary as %s: %w", inst.Path, err)
	}
	there, err := r.prepare(dir, inst.Path)
	if err != nil {
		return Installed{}, wrap(err)
	}
	if there == sum {
		if _, err := r.must(nil, "the copy is there but its mode cannot be set; is it the login user's?", plain("chmod", "0755", "--", inst.Path)); err != nil {
			return Installed{}, wrap(err)
		}
	} else {
		if err := r.upload(f, sum, inst.Path); err != nil {
			return Installed{}, wrap(err)
		}
		inst.Copied = true
	}
	if _, err := r.sweep(dir, path.Base(inst.Path), keep); err != nil {
		return inst, fmt.Errorf("installed agent-vm's binary as %s, but removing old copies failed: %w", inst.Path, err)
	}
	return inst, nil
}

// Uninstall removes dir/agent-vm-* copies on the host that no process runs
// (and temporary files of Install's), and dir too if it is then empty. A
// dir that is not there is fine; a copy still running stays, and so does dir.
func Uninstall(ctx context.Context, c *ssh.Client, dir string) error {
	if !path.IsAbs(dir) {
		return fmt.Errorf("removing agent-vm's binaries from %s: the directory %q is not an absolute path (hint: give the full path Install was given)", c.RemoteAddr(), dir)
	}
	dir = path.Clean(dir)
	r := remote{ctx: ctx, c: c}
	empty, err := r.sweep(dir, "", 0)
	if err == nil && empty {
		_, err = r.must(nil, "the directory is empty but cannot be removed; may the login user write to its parent?", plain("rmdir", "--", dir))
	}
	if err != nil {
		return fmt.Errorf("removing agent-vm's binaries from %s: %w", dir, err)
	}
	return nil
}

// Version runs `path version` on the host and returns its output, trimmed.
func Version(ctx context.Context, c *ssh.Client, path string) (string, error) {
	out, err := remote{ctx: ctx, c: c}.must(nil, "Install puts agent-vm's binary on the host; is this the path it returned?", plain(path, "version"))
	if err != nil {
		return "", fmt.Errorf("asking agent-vm's binary for its version: %w", err)
	}
	return strings.TrimSpace(out), nil
}

// openBinary opens src and returns it with its sha256 in hex.
func openBinary(src string) (*os.File, string, error) {
	f, err := os.Open(src)
	if err != nil {
		return nil, "", fmt.Errorf("reading the binary to install on a host: %w", err)
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s is not a regular file", src)
	}
	h := sha256.New()
	if err == nil {
		_, err = io.Copy(h, f)
	}
	if err != nil {
		f.Close()
		return nil, "", fmt.Errorf("reading the binary to install on a host: %w", err)
	}
	return f, hex.EncodeToString(h.Sum(nil)), nil
}

// prepareScript checks the host's side before a copy (args: dir, the
// copy's path). It prints dir's mode in octal, then the sha256sum line of
// the copy if a regular file of the login user's is there. Exit codes
// above 100 are the refusals prepare explains.
const prepareScript = `dir=$1 dst=$2
command -v sha256sum >/dev/null 2>&1 || exit 101
command -v pgrep >/dev/null 2>&1 || exit 102
[ -L "$dir" ] && exit 103
mkdir -p -m 0700 -- "$dir" || exit 1
[ -O "$dir" ] || exit 104
stat -c %a -- "$dir" || exit 1
if [ -L "$dst" ] || { [ -e "$dst" ] && [ ! -f "$dst" ]; }; then exit 105; fi
if [ -f "$dst" ] && [ -O "$dst" ]; then sha256sum < "$dst" || exit 1; fi
`

// prepare makes dir if missing, refuses one agent-vm should not keep its
// binary in, and returns the sha256 of the copy at dst ("" if none).
func (r remote) prepare(dir, dst string) (string, error) {
	res, err := r.exec(nil, script("prepare", prepareScript, dir, dst))
	if err != nil {
		return "", err
	}
	host := r.c.RemoteAddr()
	switch res.code {
	case 0:
	case 101:
		return "", fmt.Errorf("%s has no sha256sum, which each copy is checked with (hint: install coreutils on the host)", host)
	case 102:
		return "", fmt.Errorf("%s has no pgrep, which tells the copies in use from the old ones (hint: install procps on the host)", host)
	case 103:
		return "", fmt.Errorf("%q on %s is a symbolic link; agent-vm keeps its binary only in a real directory (hint: give the directory it points to, or remove the link)", dir, host)
	case 104:
		return "", fmt.Errorf("%q on %s is not the login user's (hint: give a directory of the login user's, or chown it)", dir, host)
	case 105:
		return "", fmt.Errorf("%q on %s is there but not a regular file (hint: remove it; Install puts the copy there)", dst, host)
	default:
		return "", r.failed(res, "may the login user create and write to the directory?")
	}
	lines := strings.SplitN(strings.TrimSpace(res.stdout), "\n", 2)
	mode, err := strconv.ParseUint(lines[0], 8, 32)
	if err != nil {
		return "", r.failed(res, "the host's stat printed no mode; is it GNU or busybox stat?")
	}
	if mode&0o022 != 0 {
		return "", fmt.Errorf("%q on %s is writable by others (mode %04o), who could replace agent-vm's binary (hint: `chmod go-w` it on the host)", dir, host, mode)
	}
	if len(lines) < 2 {
		return "", nil
	}
	return sumOf(lines[1]), nil
}

// uploadScript writes its stdin to $1, a temporary name beside $2, and
// renames it to $2 once its sha256 is $3 and it is 0755; a step that fails
// removes it. Exit 106: the sha256 differs (printed on stdout). An upload
// cut short with the connection may leave the temporary file; a later
// sweep removes it.
const uploadScript = `tmp=$1 dst=$2 want=$3
fail() { rm -f -- "$tmp"; exit "$1"; }
cat > "$tmp" || fail 1
sum=$(sha256sum < "$tmp") || fail 1
sum=${sum%% *}
[ "$sum" = "$want" ] || { echo "$sum"; fail 106; }
chmod 0755 -- "$tmp" || fail 1
mv -f -- "$tmp" "$dst" || fail 1
`

// upload copies f to dst on the host (uploadScript), in one session.
func (r remote) upload(f *os.File, sum, dst string) error {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("reading the binary to install again: %w", err)
	}
	tmp := path.Join(path.Dir(dst), "."+path.Base(dst)+"."+randomHex(8)+".tmp")
	res, err := r.exec(f, script("upload", uploadScript, tmp, dst, sum))
	switch {
	case err != nil:
		return err
	case res.code == 106:
		return fmt.Errorf("the copy %s has sha256 %s on %s, want %s (hint: the local file may have changed while it was copied, or the host's disk failed; try again)", tmp, strings.TrimSpace(res.stdout), r.c.RemoteAddr(), sum)
	case res.code != 0:
		return r.failed(res, "may the login user write to the directory, and is its disk full?")
	}
	return nil
}

// sumOf is the hash of a sha256sum output line ("" if it has none).
func sumOf(line string) string {
	f := strings.Fields(line)
	if len(f) == 0 || len(f[0]) != 64 {
		return ""
	}
	if _, err := hex.DecodeString(f[0]); err != nil {
		return ""
	}
	return f[0]
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}
