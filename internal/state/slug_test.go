package state

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestSlug(t *testing.T) {
	for branch, want := range map[string]string{
		"main":                   "main",
		"feature/x":              "feature-x",
		"Feature/X":              "feature-x",
		"fix--double//slash":     "fix-double-slash",
		"-leading/and/trailing-": "leading-and-trailing",
		"release/1.2.3":          "release-1-2-3",
		"user@host":              "user-host",
		"a'b\"c${d}\\e\nf":       "a-b-c-d-e-f",
	} {
		got, err := Slug(branch)
		if err != nil || got != want {
			t.Errorf("Slug(%q) = %q, %v; want %q", branch, got, err, want)
		}
	}
}

func TestSlugHashesUnrepresentableAndLongNames(t *testing.T) {
	a, _ := Slug("日本語")
	b, _ := Slug("中文")
	if !strings.HasPrefix(a, "branch-") || a == b {
		t.Errorf("non-ASCII names: %q and %q must be distinct hashed names", a, b)
	}
	long1, _ := Slug("feature/" + strings.Repeat("very-long-name-", 10) + "one")
	long2, _ := Slug("feature/" + strings.Repeat("very-long-name-", 10) + "two")
	if len(long1) > MaxSlugLen || long1 == long2 || !ValidSlug(long1) {
		t.Errorf("long names: %q, %q", long1, long2)
	}
	if _, err := Slug("  "); err == nil {
		t.Error("blank branch accepted")
	}
}

// FuzzSlug checks that no branch name yields a slug that escapes the state
// directory or is unsafe as a hostname, Nix name or QEMU -name.
func FuzzSlug(f *testing.F) {
	for _, s := range []string{"main", "feature/x", "../../etc", "..", ".", "a/../../b", "x\x00y", "-", "@", strings.Repeat("z", 300), "Ä/ö", "a,b=c", "${x}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, branch string) {
		slug, err := Slug(branch)
		if err != nil {
			if strings.TrimSpace(branch) != "" {
				t.Fatalf("Slug(%q) failed: %v", branch, err)
			}
			return
		}
		if !ValidSlug(slug) || len(slug) > 63 {
			t.Fatalf("Slug(%q) = %q is not a valid hostname label", branch, slug)
		}
		// Path safety: one component, inside the root.
		root := "/state"
		p := filepath.Join(root, slug)
		if filepath.Dir(p) != root || filepath.Base(p) != slug || slug == "." || slug == ".." {
			t.Fatalf("Slug(%q) = %q escapes the state dir", branch, slug)
		}
		// Nix store names allow [A-Za-z0-9+-._?=], must not start with '.';
		// QEMU -name treats ',' specially; shells and JSON need no quoting.
		for _, r := range slug {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				t.Fatalf("Slug(%q) = %q contains %q", branch, slug, r)
			}
		}
		if again, _ := Slug(branch); again != slug {
			t.Fatalf("Slug(%q) is not deterministic: %q then %q", branch, slug, again)
		}
	})
}
