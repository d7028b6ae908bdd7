package scenario

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/agent-vm/agent-vm/integration/harness"
)

// hostileBranches are branch names a careless implementation would splice
// into a shell, a path, Nix or a QEMU argument. Each must either work (a
// VM whose record says exactly that branch, in a directory inside the state
// directory) or fail cleanly (exit 1, a message naming the branch, nothing
// left behind). `touch pwned` must never run.
func hostileBranches() []string {
	return []string{
		`it's`,
		`say"hi"`,
		`$(touch pwned)`,
		"`touch pwned`",
		`semi;touch pwned`,
		`with space`,
		"tab\there",
		"new\nline",
		`ünïcødé-ветка-分支`,
		`feature/deep/nested`,
		`../../escape`,
		`/absolute`,
		`-rf`,
		`a..b`,
		`x.lock`,
		`ports`, // names agent-vm uses for its own locks
		`sweep`,
		`.hidden`,
		`trailing/`,
		`@{-1}`,
		`back\slash`,
		`glob*?[x]`,
		`${HOME}`,
		`nix${builtins.abort "x"}`,
		`-name,evil=1`,
		strings.Repeat("long", 70),
	}
}

// safeSlug is what a slug may look like: safe for paths, Nix, QEMU -name
// and hostnames.
var safeSlug = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)

func checkHostileNames(ctx context.Context, s *harness.S, rp *harness.Repo) error {
	var problems []error
	accepted, refused := 0, 0
	for _, name := range hostileBranches() {
		ok, err := tryHostile(ctx, s, rp, name)
		if err != nil {
			problems = append(problems, fmt.Errorf("branch %q: %w", name, err))
		}
		if ok {
			accepted++
		} else {
			refused++
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	for _, d := range []string{rp.Dir, s.Dir(), s.StateDir(), s.WorkDir()} {
		if _, err := os.Lstat(filepath.Join(d, "pwned")); err == nil {
			problems = append(problems, fmt.Errorf("a branch name ran a shell command: %s appeared", filepath.Join(d, "pwned")))
		}
	}
	if len(problems) > 0 {
		return harness.Failf(nil, "%v", errors.Join(problems...))
	}
	s.Notef("%d accepted, %d refused cleanly", accepted, refused)
	return nil
}

// tryHostile creates a VM for name and checks the outcome; accepted says
// whether agent-vm took the name.
func tryHostile(ctx context.Context, s *harness.S, rp *harness.Repo, name string) (accepted bool, err error) {
	before, err := stateEntries(s.StateDir())
	if err != nil {
		return false, err
	}
	res := s.TryCreate(ctx, rp.Dir, "--branch="+name)
	switch res.ExitCode {
	case 0:
		return true, checkAccepted(ctx, s, name)
	case 1:
	default:
		return false, fmt.Errorf("create: %s, want 0 (it works) or 1 (refused)", res.Outcome())
	}
	if !namesBranch(res.Stderr, name) {
		return false, fmt.Errorf("create refused it without naming it: %s", harness.LastLine(res.Stderr))
	}
	if strings.Contains(res.Stderr, "goroutine ") {
		return false, fmt.Errorf("agent-vm crashed: %s", harness.LastLine(res.Stderr))
	}
	after, err := stateEntries(s.StateDir())
	if err != nil {
		return false, err
	}
	if extra := newEntries(before, after); len(extra) > 0 {
		return false, fmt.Errorf("a refused create left %s behind", strings.Join(extra, ", "))
	}
	return false, nil
}

// checkAccepted: a VM agent-vm took a hostile name for says exactly that
// name, lives in a safely named directory inside the state directory, has
// its workspace at that branch, and destroys cleanly.
func checkAccepted(ctx context.Context, s *harness.S, name string) error {
	st, res, err := s.Status(ctx, name, harness.StatusKeys())
	if err != nil {
		return fmt.Errorf("status after create: %s: %s", res.Outcome(), harness.LastLine(res.Stderr+res.Stdout))
	}
	if !safeSlug.MatchString(st.Slug) {
		return fmt.Errorf("its slug %q is not safe for paths, Nix, QEMU and hostnames", st.Slug)
	}
	if !harness.SamePath(filepath.Dir(st.Paths.Dir), s.StateDir()) {
		return fmt.Errorf("its directory %s is not directly inside the state directory %s", st.Paths.Dir, s.StateDir())
	}
	head, err := harness.Git(ctx, st.Paths.Workspace, "rev-parse", "--abbrev-ref", "HEAD")
	if err != nil {
		return err
	}
	if head != name {
		return fmt.Errorf("its workspace has %q checked out", head)
	}
	res = s.AgentVM(ctx, "destroy", "--force", name)
	if res.ExitCode != 0 {
		return fmt.Errorf("destroy --force: %s: %s", res.Outcome(), harness.LastLine(res.Stderr))
	}
	if _, err := os.Lstat(st.Paths.Dir); !os.IsNotExist(err) {
		return fmt.Errorf("%s is still there after destroy", st.Paths.Dir)
	}
	return nil
}

// namesBranch reports whether an error message names the branch: verbatim
// or quoted the way Go's %q quotes.
func namesBranch(msg, name string) bool {
	q := strconv.Quote(name)
	return strings.Contains(msg, name) || strings.Contains(msg, q) || strings.Contains(msg, q[1:len(q)-1])
}

// stateEntries lists the state directory: its entries, and those of its
// staging and trash directories (where a half-done create or destroy would
// linger), as relative paths.
func stateEntries(dir string) ([]string, error) {
	var out []string
	top, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	for _, e := range top {
		out = append(out, e.Name())
		if e.Name() == ".tmp" || e.Name() == ".trash" {
			sub, _ := os.ReadDir(filepath.Join(dir, e.Name()))
			for _, x := range sub {
				out = append(out, filepath.Join(e.Name(), x.Name()))
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// newEntries lists what after has and before had not. A lock file is not a
// leftover (locks are kept on purpose).
func newEntries(before, after []string) []string {
	had := map[string]bool{}
	for _, b := range before {
		had[b] = true
	}
	var out []string
	for _, a := range after {
		if !had[a] && a != ".locks" && a != ".tmp" && a != ".trash" {
			out = append(out, a)
		}
	}
	return out
}

// checkSlugCollision: two branches that map to one slug cannot both have a
// VM; the second create fails naming the conflict and leaves nothing.
func checkSlugCollision(ctx context.Context, s *harness.S, rp *harness.Repo) error {
	first := "itest/slug"
	if _, err := s.Create(ctx, rp.Dir, first); err != nil {
		return err
	}
	st, _, err := s.Status(ctx, first, harness.StatusKeys())
	if err != nil {
		return err
	}
	second := st.Slug // a branch named like the slug has that slug too
	if second == first {
		return harness.Failf(nil, "the slug of %q is %q, the branch itself; want '/' replaced", first, st.Slug)
	}
	before, err := stateEntries(s.StateDir())
	if err != nil {
		return err
	}
	res := s.TryCreate(ctx, rp.Dir, second)
	if err := harness.Want(res, 1); err != nil {
		return err
	}
	if !namesBranch(res.Stderr, second) && !namesBranch(res.Stderr, first) {
		return harness.Failf(res, "the error names neither %q nor %q", second, first)
	}
	after, err := stateEntries(s.StateDir())
	if err != nil {
		return err
	}
	if extra := newEntries(before, after); len(extra) > 0 {
		return harness.Failf(res, "the refused create left %s behind", strings.Join(extra, ", "))
	}
	if _, err := s.OK(ctx, "destroy", "--force", first); err != nil {
		return err
	}
	return checkGone(ctx, s, first, st.Paths.Dir)
}

// checkTwoRepositories: a VM belongs to a repository and a branch. Two
// repositories each get a VM for main; commands run in one see only its
// own; from outside any repository "main" means both and is refused, listing
// them; destroy with no BRANCH in the second removes its VM, never the first's.
func checkTwoRepositories(ctx context.Context, s *harness.S, rp *harness.Repo) error {
	dir, err := s.TempDir("second-repo")
	if err != nil {
		return err
	}
	other, err := harness.NewRepo(ctx, dir, nil)
	if err != nil {
		return err
	}
	repos := []string{rp.Dir, other.Dir}
	for _, d := range repos {
		if _, err := s.Create(ctx, d, "main"); err != nil {
			return err
		}
	}
	slugs := map[string]string{}
	for _, d := range repos {
		res := s.Call(ctx, harness.Call{Args: []string{"status", "--json"}, Dir: d}) // no BRANCH: the checkout's
		if err := harness.Want(res, 0); err != nil {
			return err
		}
		st, err := harness.ParseStatus([]byte(res.Stdout), harness.StatusKeys())
		if err != nil {
			return harness.Failf(res, "%v", err)
		}
		if st.Branch != "main" || !harness.SamePath(st.Git.Source, d) {
			return harness.Failf(res, "status in %s describes branch %q of %s, want main of %s", d, st.Branch, st.Git.Source, d)
		}
		slugs[d] = st.Slug
	}
	if slugs[rp.Dir] == slugs[other.Dir] {
		return harness.Failf(nil, "both repositories' main VMs are named %q", slugs[rp.Dir])
	}
	res := s.AgentVM(ctx, "status", "main") // outside any repository
	if err := harness.Want(res, 1); err != nil {
		return err
	}
	for _, d := range repos {
		if !strings.Contains(res.Stderr, slugs[d]) || !strings.Contains(res.Stderr, d) {
			return harness.Failf(res, "the refusal of an ambiguous name does not list VM %s of %s", slugs[d], d)
		}
	}
	if err := harness.Want(s.Call(ctx, harness.Call{Args: []string{"destroy", "--force"}, Dir: other.Dir}), 0); err != nil {
		return err
	}
	res = s.Call(ctx, harness.Call{Args: []string{"destroy", "--force", "main"}, Dir: other.Dir})
	if err := harness.Want(res, 1); err != nil {
		return err
	}
	if !strings.Contains(res.Stderr, rp.Dir) {
		return harness.Failf(res, "destroy main in a repository without one does not name the repository that has one (%s)", rp.Dir)
	}
	res = s.Call(ctx, harness.Call{Args: []string{"status", "--json", "main"}, Dir: rp.Dir})
	if err := harness.Want(res, 0); err != nil {
		return harness.Failf(res, "the first repository's main VM is gone after destroys in the second")
	}
	return harness.Want(s.Call(ctx, harness.Call{Args: []string{"destroy", "--force", "main"}, Dir: rp.Dir}), 0)
}
