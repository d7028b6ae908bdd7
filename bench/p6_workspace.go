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

	"github.com/agent-vm/agent-vm/bench/report"
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

// p6Measure runs the rounds on v, whose workspace is over fstype, and
// returns its rows, named P6.<label>.<op>.
func p6Measure(ctx context.Context, l *lab, v *labVM, fstype, label string) ([]*report.Row, error) {
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
	if len(fs) != 3 || fs[1] != fstype {
		return nil, fmt.Errorf("expected /workspace over %s in the guest, findmnt says %q", fstype, strings.TrimSpace(res.Stdout))
	}
	times := map[string]map[string][]float64{}
	for r := 1; r <= l.cfg.Rounds; r++ {
		l.log.Printf("P6 %s round %d/%d", label, r, l.cfg.Rounds)
		res := l.av.run(ctx, 30*time.Minute, "exec", v.name, "--", "sh", "-c", p6Round(r))
		if res.Err == nil {
			res.Err = parseP6(res.Stdout, times)
		}
		if res.Err != nil {
			return nil, res.Err
		}
	}
	var rows []*report.Row
	for _, o := range p6Ops() {
		row := report.NewRow("P6."+label+"."+o.op, o.what, "s",
			report.NewSeries("/workspace over "+label, times[o.op]["ws"]), report.Ref("guest disk ("+fs[2]+")", times[o.op]["disk"]), true)
		if row.ID == "P6.virtiofs.untar" {
			row.Note = "goal: 1.5x or less"
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// p6Mode is one way of sharing the workspace that P6 measures: a
// virtiofsd cache mode (start --workspace-cache) with more virtiofsd
// arguments, or 9p.
type p6Mode struct {
	Name  string   // as given, e.g. "auto", "always+writeback", "auto+tp4", "9p"
	Cache string   // none, auto, always; "" for 9p
	Extra []string // more arguments for (QEMU's C) virtiofsd
}

// label is the mode's part of its rows' ids: the default mode keeps the
// ids of the results before modes existed.
func (m p6Mode) label() string {
	switch m.Name {
	case "auto":
		return "virtiofs"
	case "9p":
		return "9p"
	}
	return "virtiofs-" + m.Name
}

// p6ModesEnv chooses the modes P6 compares, in order, comma-separated
// (default "auto,9p"): a virtiofsd cache mode (none, auto, always),
// optionally followed by +writeback (-o writeback), +tpN
// (--thread-pool-size=N), +tN (-o timeout=N, seconds the guest trusts
// names and attributes), or 9p, e.g.
//
//	BENCH_P6_MODES=auto,always,none,auto+writeback,auto+tp4 go run ./bench -only P6
//
// (an environment variable because the harness's flags live in main.go).
// Beware +tpN with QEMU 7.2's C virtiofsd on Debian 12: its seccomp
// filter kills the pool threads (sched_getaffinity) and the guest's
// workspace hangs, so the round never ends (seen 2026-11-23).
const p6ModesEnv = "BENCH_P6_MODES"

// parseP6Modes reads a list of modes (see p6ModesEnv).
func parseP6Modes(s string) ([]p6Mode, error) {
	if strings.TrimSpace(s) == "" {
		s = "auto,9p"
	}
	var modes []p6Mode
	seen := map[string]bool{}
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if seen[name] {
			return nil, fmt.Errorf("%s: mode %q given twice", p6ModesEnv, name)
		}
		seen[name] = true
		if name == "9p" {
			modes = append(modes, p6Mode{Name: name})
			continue
		}
		parts := strings.Split(name, "+")
		m := p6Mode{Name: name, Cache: parts[0]}
		switch m.Cache {
		case "none", "auto", "always":
		default:
			return nil, fmt.Errorf("%s: mode %q does not start with none, auto or always (or is not 9p) (hint: e.g. %s=auto,always+writeback,9p)", p6ModesEnv, name, p6ModesEnv)
		}
		for _, p := range parts[1:] {
			switch n, err := strconv.Atoi(p[min(len(p), 2):]); {
			case p == "writeback":
				m.Extra = append(m.Extra, "-o", "writeback")
			case strings.HasPrefix(p, "tp") && err == nil && n >= 0:
				m.Extra = append(m.Extra, "--thread-pool-size="+strconv.Itoa(n))
			case strings.HasPrefix(p, "t") && len(p) > 1:
				t, err := strconv.Atoi(p[1:])
				if err != nil || t < 0 {
					return nil, fmt.Errorf("%s: %q in mode %q: +tN needs whole seconds", p6ModesEnv, p, name)
				}
				m.Extra = append(m.Extra, "-o", "timeout="+strconv.Itoa(t))
			default:
				return nil, fmt.Errorf("%s: %q in mode %q is not writeback, tpN or tN", p6ModesEnv, p, name)
			}
		}
		modes = append(modes, m)
	}
	return modes, nil
}

// runP6 measures each mode on one VM, restarting it between modes; 9p
// comes from the same VM started where agent-vm finds no virtiofsd.
func runP6(ctx context.Context, l *lab, f *report.Figure) error {
	modes, err := parseP6Modes(os.Getenv(p6ModesEnv))
	if err != nil {
		return err
	}
	v, err := l.running(ctx)
	if err != nil {
		return err
	}
	if _, err := l.tarball(ctx); err != nil {
		return err
	}
	f.Notes = append(f.Notes, fmt.Sprintf("Source tree: %s (%d files). Times are the guest's clock around each operation. Ratios above 1 mean the workspace is slower than the guest's disk.", l.cfg.Tree, l.treeFiles))
	// The virtiofsd wrappers' directory (see virtiofsdWrapper), removed at
	// the end: a virtiofsd that runs keeps its binary open.
	wrapDir, err := os.MkdirTemp("/run", "agent-vm-bench-virtiofsd-")
	if err != nil {
		wrapDir = ""
	} else {
		defer os.RemoveAll(wrapDir)
		_ = os.Chmod(wrapDir, 0o755)
	}
	fresh := true // v runs as l.running started it: cache auto, no extra arguments
	for _, m := range modes {
		if !fresh || m.Name != "auto" {
			if err := l.stop(ctx, v); err != nil {
				return err
			}
			skip, err := p6Restart(ctx, l, v, m, wrapDir, f)
			if err != nil {
				return err
			}
			if skip {
				continue
			}
		}
		fresh = false
		fstype := "virtiofs"
		if m.Name == "9p" {
			fstype = "9p"
		}
		rows, err := p6Measure(ctx, l, v, fstype, m.label())
		f.Rows = append(f.Rows, rows...)
		if err != nil {
			return err
		}
	}
	return l.stop(ctx, v)
}

// p6Restart starts the stopped v in mode m. skip: m cannot be measured
// here, and a note in f says why.
func p6Restart(ctx context.Context, l *lab, v *labVM, m p6Mode, wrapDir string, f *report.Figure) (skip bool, err error) {
	var prefix, flags []string
	want := "virtiofs"
	switch {
	case m.Name == "9p":
		var why string
		if prefix, why = coverVirtiofsd(l.dir, ""); why != "" {
			f.Notes = append(f.Notes, "9p not measured: "+why)
			return true, nil
		}
		want = "9p"
		f.Notes = append(f.Notes, "agent-vm has no switch for 9p: the 9p rows come from the same VM started in a private mount namespace where every place agent-vm looks for virtiofsd is covered by an empty file, so it falls back to 9p as on a host without virtiofsd.")
	case len(m.Extra) > 0:
		wrapper, why := virtiofsdWrapper(wrapDir, m)
		if why == "" {
			prefix, why = coverVirtiofsd(l.dir, wrapper)
		}
		if why != "" {
			f.Notes = append(f.Notes, fmt.Sprintf("mode %s not measured: %s", m.Name, why))
			return true, nil
		}
		f.Notes = append(f.Notes, fmt.Sprintf("mode %s: virtiofsd ran with %q added, through a wrapper bound over it in a private mount namespace (agent-vm has no switch for it).", m.Name, strings.Join(m.Extra, " ")))
	}
	if m.Cache != "" {
		flags = []string{"--workspace-cache", m.Cache}
	}
	l.log.Printf("P6: starting %s with the workspace over %s (mode %s)", v.name, want, m.Name)
	t, err := l.start(ctx, v, prefix, flags...)
	if err != nil {
		return false, err
	}
	if t.Share != want {
		f.Notes = append(f.Notes, fmt.Sprintf("mode %s not measured: agent-vm used %s", m.Name, t.Share))
		return true, l.stop(ctx, v)
	}
	return false, l.settle(ctx, v)
}

// virtiofsdPlaces are where agent-vm looks for virtiofsd besides PATH
// (README: Debian's /usr/lib/qemu, others' /usr/libexec).
func virtiofsdPlaces() []string {
	return []string{"/usr/libexec/virtiofsd", "/usr/lib/qemu/virtiofsd", "/usr/lib/virtiofsd"}
}

// foundVirtiofsds are the virtiofsd binaries present, the one agent-vm
// would use first.
func foundVirtiofsds() []string {
	var cands, found []string
	if p, err := exec.LookPath("virtiofsd"); err == nil {
		cands = append(cands, p)
	}
	for _, p := range append(cands, virtiofsdPlaces()...) {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			found = append(found, p)
		}
	}
	return found
}

// virtiofsdWrapper writes, into dir, a script that runs a copy of the
// virtiofsd agent-vm would use with m's extra arguments added, or says why
// not. dir must be reachable by the workspace's owner outside /tmp: as
// root, agent-vm's virtiofsd jail runs it as that owner with the workspace
// mounted over /tmp (package sharejail).
func virtiofsdWrapper(dir string, m p6Mode) (path, why string) {
	found := foundVirtiofsds()
	if len(found) == 0 {
		return "", "no virtiofsd on this host"
	}
	if dir == "" {
		return "", "no directory in /run for the wrapper (it needs root)"
	}
	help, _ := exec.Command(found[0], "--help").CombinedOutput()
	if strings.Contains(string(help), "--shared-dir") {
		return "", "the extra arguments are QEMU's C virtiofsd's, and " + found[0] + " is the Rust one"
	}
	real := filepath.Join(dir, "virtiofsd.real")
	if _, err := os.Stat(real); err != nil {
		if err := copyFile(found[0], real); err != nil {
			return "", err.Error()
		}
		if err := os.Chmod(real, 0o755); err != nil {
			return "", err.Error()
		}
	}
	path = filepath.Join(dir, "virtiofsd-"+strings.NewReplacer("+", "-").Replace(m.Name))
	script := "#!/bin/sh\nexec " + real + ` "$@" ` + strings.Join(m.Extra, " ") + "\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		return "", err.Error()
	}
	return path, ""
}

// coverVirtiofsd is a command prefix that runs agent-vm in a private mount
// namespace where every virtiofsd is covered by the file with (an empty,
// non-executable one when with is ""); or why it cannot (it needs root and
// unshare).
func coverVirtiofsd(dir, with string) (prefix []string, why string) {
	if os.Geteuid() != 0 {
		return nil, "covering virtiofsd for agent-vm needs root (a private mount namespace)"
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		return nil, "unshare (util-linux) is not installed"
	}
	if with == "" {
		with = filepath.Join(dir, "no-virtiofsd")
		if err := os.WriteFile(with, nil, 0o644); err != nil {
			return nil, err.Error()
		}
	}
	cover := foundVirtiofsds()
	script := `set -e; with=$1; n=$2; shift 2
while [ "$n" -gt 0 ]; do mount --bind "$with" "$1"; shift; n=$((n-1)); done
exec "$@"`
	prefix = append([]string{"unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", with, strconv.Itoa(len(cover))}, cover...)
	return prefix, ""
}
