package gitws

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// unpushed lists the commits that local refs (branches, tags, notes, any
// ref but remote-tracking ones and the stash, which Inspect lists on its
// own) and a detached HEAD reach, but no remote-tracking branch does and,
// when source is given, no branch, tag or synced VM branch (SyncRefs) of
// the source repository either.
func (g *Git) unpushed(ctx context.Context, r repo, source string) ([]Commit, error) {
	exclude := append([]string{"--remotes"}, g.inSource(ctx, r, source)...)
	tips, err := g.localTips(ctx, r)
	if err != nil || len(tips) == 0 {
		return nil, err
	}
	// One walk over every tip says whether anything is unsaved at all (a
	// workspace may have thousands of tags); only the tips that are
	// themselves unsaved are walked one by one, to say where each commit is.
	all, err := g.untrusted(ctx, r, append(append([]string{"rev-list"}, refNames(tips)...), append([]string{"--not"}, exclude...)...)...)
	if err != nil || all == "" {
		return nil, err
	}
	unsaved := map[string]bool{}
	for _, sha := range lines(all) {
		unsaved[sha] = true
	}
	var out []Commit
	seen := map[string]bool{}
	for _, t := range tips {
		if !unsaved[t.commit] && t.commit != "" {
			continue
		}
		args := append([]string{"rev-list", "--format=%h %s", "--no-commit-header", t.ref, "--not"}, exclude...)
		text, err := g.untrusted(ctx, r, args...)
		if err != nil {
			return nil, err
		}
		for _, l := range lines(text) {
			hash, subject, _ := strings.Cut(l, " ")
			if !seen[hash] {
				seen[hash] = true
				out = append(out, Commit{Ref: t.ref, Hash: hash, Subject: subject})
			}
		}
	}
	return out, nil
}

// tip is a local ref and the commit it points at ("" when that takes more
// than one step to find: a tag of a tag).
type tip struct {
	ref, commit string
}

func refNames(tips []tip) []string {
	var out []string
	for _, t := range tips {
		out = append(out, t.ref)
	}
	return out
}

// localTips lists the refs whose commits count as the workspace's own, in
// the order commits are attributed to them: branches, a detached HEAD,
// tags, then any other ref.
func (g *Git) localTips(ctx context.Context, r repo) ([]tip, error) {
	refs, err := g.untrusted(ctx, r, "for-each-ref", "--format=%(refname)%00%(objecttype)%00%(objectname)%00%(*objectname)")
	if err != nil {
		return nil, err
	}
	var tips []tip
	for _, l := range lines(refs) {
		f := strings.Split(l, "\x00")
		if len(f) != 4 || strings.HasPrefix(f[0], "refs/remotes/") || f[0] == "refs/stash" || strings.HasPrefix(f[0], "refs/prefetch/") {
			continue
		}
		t := tip{ref: f[0]}
		switch {
		case f[1] == "commit":
			t.commit = f[2]
		case f[1] == "tag" && f[3] != "":
			t.commit = f[3] // may be a tree or blob: then no commit is unsaved there
		}
		tips = append(tips, t)
	}
	if _, err := g.untrusted(ctx, r, "symbolic-ref", "--quiet", "HEAD"); err != nil {
		if head, err := g.untrusted(ctx, r, "rev-parse", "--verify", "--quiet", "HEAD^{commit}"); err == nil { // detached
			tips = append(tips, tip{ref: "HEAD", commit: head})
		}
	}
	rank := func(ref string) int {
		switch {
		case strings.HasPrefix(ref, "refs/heads/"):
			return 0
		case ref == "HEAD":
			return 1
		case strings.HasPrefix(ref, "refs/tags/"):
			return 2
		}
		return 3
	}
	sort.SliceStable(tips, func(i, j int) bool { return rank(tips[i].ref) < rank(tips[j].ref) })
	return tips, nil
}

// inSource lists the tips of the source repository's branches, tags and
// synced VM branches (SyncRefs) that the workspace has too: work that
// reached the source is saved.
func (g *Git) inSource(ctx context.Context, r repo, source string) []string {
	if source == "" {
		return nil
	}
	if _, err := os.Lstat(filepath.Join(source, ".git")); err != nil {
		return nil
	}
	// The source is the user's own repository: reading it is safe.
	out, err := g.git(ctx, source, "for-each-ref", "--format=%(objectname)", "refs/heads", "refs/tags", strings.TrimSuffix(SyncRefs, "/"))
	if err != nil {
		return nil
	}
	var shas []string
	for _, sha := range lines(out) {
		if _, err := g.untrusted(ctx, r, "cat-file", "-e", sha+"^{commit}"); err == nil {
			shas = append(shas, sha)
		}
	}
	return shas
}
