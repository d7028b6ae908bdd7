package state

import (
	"errors"
	"strings"
	"testing"
)

func entryOf(slug, branch, repo, source string) Entry {
	return Entry{Slug: slug, Record: &Record{Slug: slug, Branch: branch, Git: Git{Repo: repo, Source: source}}}
}

func TestFindResolvesWithinTheRepository(t *testing.T) {
	broken := Entry{Slug: "old", Err: errors.New("unreadable")}
	entries := []Entry{
		entryOf("main", "main", "r1", "/src/one"),
		entryOf("main-1a2b3c", "main", "r2", "/src/two"),
		entryOf("a-b", "a.b", "r1", "/src/one"),
		entryOf("a-b-9f8e7d", "a-b", "r1", "/src/one"),
		entryOf("solo", "solo", "r2", "/src/two"),
		broken,
	}
	one := Here{Repo: "r1", Top: "/src/one"}
	for _, c := range []struct {
		name     string
		h        Here
		wantSlug string
		wantErr  []string
		notFound bool
	}{
		{name: "main", h: one, wantSlug: "main"},
		{name: "main", h: Here{Repo: "r2", Top: "/src/two"}, wantSlug: "main-1a2b3c"},
		// a branch name wins over a VM name
		{name: "a-b", h: one, wantSlug: "a-b-9f8e7d"},
		{name: "a.b", h: one, wantSlug: "a-b"},
		{name: "solo", h: one, notFound: true, wantErr: []string{`no VM for "solo" in the repository at /src/one`, "VM solo: branch \"solo\" of /src/two", "cd /src/two"}},
		{name: "nope", h: one, notFound: true, wantErr: []string{`no VM for branch "nope" in the repository at /src/one`, "agent-vm create nope"}},
		{name: "old", h: one, wantSlug: "old"},
		// outside any repository: only a single match
		{name: "solo", wantSlug: "solo"},
		{name: "main", wantErr: []string{`"main" names more than one VM`, "VM main: branch \"main\" of /src/one", "VM main-1a2b3c"}},
		{name: "nope", notFound: true, wantErr: []string{`no VM for branch "nope" in /state`}},
	} {
		e, err := Find(entries, c.name, c.h, "/state")
		if c.wantErr == nil {
			if err != nil || e.Slug != c.wantSlug {
				t.Errorf("Find(%q, repo %q) = %q, %v; want %q", c.name, c.h.Repo, e.Slug, err, c.wantSlug)
			}
			continue
		}
		if err == nil {
			t.Errorf("Find(%q, repo %q) = %q; want a refusal", c.name, c.h.Repo, e.Slug)
			continue
		}
		if errors.Is(err, ErrNotFound) != c.notFound {
			t.Errorf("Find(%q, repo %q): ErrNotFound is %v, want %v", c.name, c.h.Repo, errors.Is(err, ErrNotFound), c.notFound)
		}
		for _, w := range c.wantErr {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Find(%q, repo %q): the refusal does not say %q:\n%v", c.name, c.h.Repo, w, err)
			}
		}
	}
}
