package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// P6 times file operations in the guest, on the shared workspace and on
// the guest's own disk, alternating the two. Times come from the guest's
// clock around each operation, so the SSH round trip of `exec` is not in
// them. Before each operation but a warm `git status`, the guest syncs
// and drops its caches (the host's page cache stays warm: that is what a
// shared workspace gives).

// p6Op is an operation and the words the table uses for it.
type p6Op struct{ op, what string }

// p6Ops are the operations, in the order each round runs them.
func p6Ops() []p6Op {
	return []p6Op{
		{"write", "dd write 200 MiB (conv=fsync)"},
		{"read", "dd read 200 MiB, guest cache dropped"},
		{"untar", "untar the source tree, then sync"},
		{"rm", "rm -rf the unpacked tree, then sync"},
		{"gitcold", "`git status` in a clone of the tree, guest cache dropped"},
		{"gitwarm", "`git status` again right after"},
	}
}

// p6Setup is run once per boot: the tarball moves from the workspace
// (where the host put it) to the guest's disk, so both sides unpack from
// the same place, and the workspace is cloned onto the guest's disk for
// the git figures. It prints the two file systems.
const p6Setup = `set -eu
cp /workspace/.bench-tree.tar "$HOME/.bench-tree.tar"
rm -f /workspace/.bench-tree.tar
rm -rf "$HOME/.bench-repo" "$HOME/.bench-io" /workspace/.bench-io
git clone -q /workspace "$HOME/.bench-repo"
git -C /workspace status --porcelain >/dev/null
git -C "$HOME/.bench-repo" status --porcelain >/dev/null
echo "fs $(findmnt -no FSTYPE -T /workspace) $(findmnt -no FSTYPE -T "$HOME")"
`

// p6Prelude defines the operations; measure prints
// "result OP TARGET T0 T1" with the guest's clock.
const p6Prelude = `set -eu
tar=$HOME/.bench-tree.tar
drop() { sync; echo 3 | sudo tee /proc/sys/vm/drop_caches >/dev/null; }
now() { date +%s.%N; }
op_write() { dd if=/dev/zero of="$1/dd" bs=1M count=200 conv=fsync status=none; }
op_read() { dd if="$1/dd" of=/dev/null bs=1M status=none; rm -f "$1/dd"; }
op_untar() { mkdir -p "$1/tree"; tar -xf "$tar" -C "$1/tree"; sync; }
op_rm() { rm -rf "$1/tree"; sync; }
op_gitcold() { git -C "$2" status --porcelain >/dev/null; }
op_gitwarm() { git -C "$2" status --porcelain >/dev/null; }
measure() {
	[ "$1" = gitwarm ] || drop
	t0=$(now); "op_$1" "$3" "$4"; t1=$(now)
	echo "result $1 $2 $t0 $t1"
}
mkdir -p /workspace/.bench-io "$HOME/.bench-io"
`

// p6Target is a side's scratch directory and git clone of the tree: the
// workspace ("ws") or the guest's disk ("disk").
func p6Target(side string) (dir, repo string) {
	if side == "ws" {
		return "/workspace/.bench-io", "/workspace"
	}
	return "$HOME/.bench-io", "$HOME/.bench-repo"
}

// p6Round is one round's script: each operation on both sides, the side
// that goes first alternating between rounds (the warm git status
// follows its own side's cold one).
func p6Round(round int) string {
	order := []string{"ws", "disk"}
	if round%2 == 0 {
		order = []string{"disk", "ws"}
	}
	var b strings.Builder
	b.WriteString(p6Prelude)
	line := func(op, target string) {
		dir, repo := p6Target(target)
		fmt.Fprintf(&b, "measure %s %s \"%s\" \"%s\"\n", op, target, dir, repo)
	}
	for _, o := range p6Ops() {
		switch o.op {
		case "gitwarm":
			continue
		case "gitcold":
			for _, target := range order {
				line("gitcold", target)
				line("gitwarm", target)
			}
		default:
			for _, target := range order {
				line(o.op, target)
			}
		}
	}
	b.WriteString("rmdir /workspace/.bench-io \"$HOME/.bench-io\"\n")
	return b.String()
}

// parseP6 reads a round's output into seconds per operation and side.
func parseP6(out string, into map[string]map[string][]float64) error {
	sc := bufio.NewScanner(strings.NewReader(out))
	n := 0
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 5 || f[0] != "result" {
			continue
		}
		t0, err0 := strconv.ParseFloat(f[3], 64)
		t1, err1 := strconv.ParseFloat(f[4], 64)
		if err0 != nil || err1 != nil {
			return fmt.Errorf("reading the guest's times in %q", sc.Text())
		}
		if into[f[1]] == nil {
			into[f[1]] = map[string][]float64{}
		}
		into[f[1]][f[2]] = append(into[f[1]][f[2]], t1-t0)
		n++
	}
	if n != 2*len(p6Ops()) {
		return fmt.Errorf("the guest reported %d of %d timings; output ends: %s", n, 2*len(p6Ops()), tail(out, 3))
	}
	return nil
}

// p6Measure runs the rounds on v (booted with the given share) and
// returns its rows.
func p6Measure(ctx context.Context, l *lab, v *labVM, share string) ([]*Row, error) {
	st, err := l.av.status(ctx, v.name)
	if err != nil {
		return nil, err
	}
	tar, err := l.tarball(ctx)
	if err != nil {
		return nil, err
	}
	if err := copyFile(tar, filepath.Join(st.Paths.Workspace, ".bench-tree.tar")); err != nil {
		return nil, err
	}
	_ = os.Chmod(filepath.Join(st.Paths.Workspace, ".bench-tree.tar"), 0o644)
	res := l.av.run(ctx, 10*time.Minute, "exec", v.name, "--", "sh", "-c", p6Setup)
	if res.Err != nil {
		return nil, res.Err
	}
	fs := strings.Fields(strings.TrimSpace(res.Stdout))
	if len(fs) != 3 || fs[1] != share {
		return nil, fmt.Errorf("expected /workspace over %s in the guest, findmnt says %q", share, strings.TrimSpace(res.Stdout))
	}
	times := map[string]map[string][]float64{}
	for r := 1; r <= l.cfg.Rounds; r++ {
		l.log.Printf("P6 %s round %d/%d", share, r, l.cfg.Rounds)
		res := l.av.run(ctx, 30*time.Minute, "exec", v.name, "--", "sh", "-c", p6Round(r))
		if res.Err == nil {
			res.Err = parseP6(res.Stdout, times)
		}
		if res.Err != nil {
			return nil, res.Err
		}
	}
	var rows []*Row
	for _, o := range p6Ops() {
		rows = append(rows, newRow("P6."+share+"."+o.op, o.what, "s",
			series("/workspace over "+share, times[o.op]["ws"]), ref("guest disk ("+fs[2]+")", times[o.op]["disk"]), true))
	}
	return rows, nil
}

// runP6 measures virtiofs, then 9p by starting the same VM where agent-vm
// finds no virtiofsd.
func runP6(ctx context.Context, l *lab, f *Figure) error {
	v, err := l.running(ctx)
	if err != nil {
		return err
	}
	if _, err := l.tarball(ctx); err != nil {
		return err
	}
	f.Notes = append(f.Notes, fmt.Sprintf("Source tree: %s (%d files). Times are the guest's clock around each operation. Ratios above 1 mean the workspace is slower than the guest's disk.", l.cfg.Tree, l.treeFiles))
	rows, err := p6Measure(ctx, l, v, "virtiofs")
	f.Rows = append(f.Rows, rows...)
	if err != nil {
		return err
	}
	prefix, why := hideVirtiofsd(l.dir)
	if why != "" {
		f.Notes = append(f.Notes, "9p not measured: "+why)
		return nil
	}
	f.Notes = append(f.Notes, "agent-vm has no switch for 9p: the 9p rows come from the same VM started in a private mount namespace where every place agent-vm looks for virtiofsd is covered by an empty file, so it falls back to 9p as on a host without virtiofsd.")
	if err := l.stop(ctx, v); err != nil {
		return err
	}
	l.log.Printf("P6: starting %s without virtiofsd (9p)", v.name)
	t, err := l.start(ctx, v, prefix)
	if err != nil {
		return err
	}
	if t.Share != "9p" {
		f.Notes = append(f.Notes, "9p not measured: with virtiofsd hidden, agent-vm still used "+t.Share)
		return l.stop(ctx, v)
	}
	if err := l.settle(ctx, v); err != nil {
		return err
	}
	rows, err = p6Measure(ctx, l, v, "9p")
	f.Rows = append(f.Rows, rows...)
	if err != nil {
		return err
	}
	return l.stop(ctx, v)
}

// virtiofsdPlaces are where agent-vm looks for virtiofsd besides PATH
// (README: Debian's /usr/lib/qemu, others' /usr/libexec).
func virtiofsdPlaces() []string {
	return []string{"/usr/libexec/virtiofsd", "/usr/lib/qemu/virtiofsd", "/usr/lib/virtiofsd"}
}

// hideVirtiofsd is a command prefix that runs agent-vm in a private mount
// namespace where every virtiofsd is covered by an empty, non-executable
// file; or why it cannot (it needs root and unshare).
func hideVirtiofsd(dir string) (prefix []string, why string) {
	if os.Geteuid() != 0 {
		return nil, "hiding virtiofsd from agent-vm needs root (a private mount namespace)"
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		return nil, "unshare (util-linux) is not installed"
	}
	blank := filepath.Join(dir, "no-virtiofsd")
	if err := os.WriteFile(blank, nil, 0o644); err != nil {
		return nil, err.Error()
	}
	places := virtiofsdPlaces()
	if p, err := exec.LookPath("virtiofsd"); err == nil {
		places = append(places, p)
	}
	var cover []string
	for _, p := range places {
		if _, err := os.Stat(p); err == nil {
			cover = append(cover, p)
		}
	}
	script := `set -e; blank=$1; n=$2; shift 2
while [ "$n" -gt 0 ]; do mount --bind "$blank" "$1"; shift; n=$((n-1)); done
exec "$@"`
	prefix = append([]string{"unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", blank, strconv.Itoa(len(cover))}, cover...)
	return prefix, ""
}
