package gitpush

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckBranch(t *testing.T) {
	const branch = "feat"
	for _, tc := range []struct {
		name    string
		updates []Update
		refused []string // the refs refused; nil: allowed
		reason  string   // in each refused ref's reason
	}{
		{"update of its branch", []Update{{a1, b1, "refs/heads/feat"}}, nil, ""},
		{"creation of its branch", []Update{{zero1, b1, "refs/heads/feat"}}, nil, ""},
		{"sha256", []Update{{zero2, a2, "refs/heads/feat"}}, nil, ""},
		{"the probe: no updates", nil, nil, ""},
		{"another branch", []Update{{a1, b1, "refs/heads/main"}}, []string{"refs/heads/main"}, `may push only to its own branch "feat", not "main" (hint: git push origin HEAD:feat)`},
		{"its branch with a suffix", []Update{{a1, b1, "refs/heads/feat-2"}}, []string{"refs/heads/feat-2"}, `not "feat-2"`},
		{"its branch as a prefix", []Update{{a1, b1, "refs/heads/feat/x"}}, []string{"refs/heads/feat/x"}, `not "feat/x"`},
		{"a case difference", []Update{{a1, b1, "refs/heads/Feat"}}, []string{"refs/heads/Feat"}, `not "Feat"`},
		{"a tag", []Update{{zero1, b1, "refs/tags/v1"}}, []string{"refs/tags/v1"}, `may not push tags, only its branch "feat"`},
		{"a tag named as the branch", []Update{{zero1, b1, "refs/tags/feat"}}, []string{"refs/tags/feat"}, "may not push tags"},
		{"deletion of its branch", []Update{{a1, zero1, "refs/heads/feat"}}, []string{"refs/heads/feat"}, `may not delete its branch "feat"`},
		{"deletion of another", []Update{{a1, zero1, "refs/heads/main"}}, []string{"refs/heads/main"}, "may push only to its own branch"},
		{"HEAD", []Update{{a1, b1, "HEAD"}}, []string{"HEAD"}, `(refs/heads/feat)`},
		{"the branch's short name", []Update{{a1, b1, "feat"}}, []string{"feat"}, `(refs/heads/feat)`},
		{"a remote-tracking ref", []Update{{a1, b1, "refs/remotes/origin/feat"}}, []string{"refs/remotes/origin/feat"}, "may push only to its own branch"},
		{"notes", []Update{{a1, b1, "refs/notes/commits"}}, []string{"refs/notes/commits"}, "may push only to its own branch"},
		{"gerrit's refs/for", []Update{{a1, b1, "refs/for/feat"}}, []string{"refs/for/feat"}, "may push only to its own branch"},
		{"its branch with a trailing slash", []Update{{a1, b1, "refs/heads/feat/"}}, []string{"refs/heads/feat/"}, "may push only"},
		{"one good, one bad: all refused", []Update{{a1, b1, "refs/heads/feat"}, {zero1, b1, "refs/tags/v1"}}, []string{"refs/tags/v1"}, "tags"},
	} {
		err := CheckBranch(tc.updates, branch)
		if tc.refused == nil {
			if err != nil {
				t.Errorf("%s: got %v, want it allowed", tc.name, err)
			}
			continue
		}
		var re *RefusedError
		if !errors.As(err, &re) {
			t.Errorf("%s: got %v, want a *RefusedError", tc.name, err)
			continue
		}
		var refs []string
		for _, r := range re.Refs {
			refs = append(refs, r.Ref)
			if !strings.Contains(r.Reason, tc.reason) {
				t.Errorf("%s: reason %q, want it to contain %q", tc.name, r.Reason, tc.reason)
			}
		}
		if strings.Join(refs, ",") != strings.Join(tc.refused, ",") || re.Branch != branch {
			t.Errorf("%s: refused %q for branch %q, want %q for %q", tc.name, refs, re.Branch, tc.refused, branch)
		}
		if !strings.HasPrefix(err.Error(), "push refused: ") || !strings.Contains(err.Error(), `"feat"`) {
			t.Errorf("%s: message %q does not say the push is refused and name the branch", tc.name, err)
		}
	}
}

// A VM with no branch may push nothing.
func TestCheckBranchNoBranch(t *testing.T) {
	for _, ref := range []string{"refs/heads/", "refs/heads/main"} {
		if err := CheckBranch([]Update{{a1, b1, ref}}, ""); err == nil || !strings.Contains(err.Error(), "no branch") {
			t.Errorf("%s with no branch: got %v, want a refusal", ref, err)
		}
	}
}
