package state

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
)

// MaxSlugLen bounds a slug so that it stays a valid hostname label (63),
// leaves room for prefixes such as "agent-vm-" in QEMU's -name, and keeps
// unix socket paths under the state dir short.
const MaxSlugLen = 48

// slugRE is what every slug matches: a DNS label (RFC 1123) in lower case,
// which is also safe as a path component, a Nix store name and a QEMU -name.
var slugRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

// Slug maps a branch name to the name its VM uses everywhere: the state
// directory, the hostname, QEMU's -name and the Nix derivation name.
//
// The mapping lowercases, turns every run of other characters into one '-',
// and trims '-' from both ends. It is lossy ("feature/x" and "feature-x" share
// "feature-x"), so the state keeps the branch in the VM record and refuses a
// second branch that maps to a taken slug. Names that would be empty or longer
// than MaxSlugLen get a short hash of the branch, so they stay distinct.
func Slug(branch string) (string, error) {
	if strings.TrimSpace(branch) == "" {
		return "", fmt.Errorf("branch name is empty (hint: pass --branch NAME or run inside a git checkout that is on a branch)")
	}
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(branch) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			dash = false
			continue
		}
		if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	s := strings.TrimRight(b.String(), "-")
	sum := sha256.Sum256([]byte(branch))
	hash := hex.EncodeToString(sum[:])[:8]
	switch {
	case s == "":
		s = "branch-" + hash
	case len(s) > MaxSlugLen:
		s = strings.TrimRight(s[:MaxSlugLen-len(hash)-1], "-") + "-" + hash
	}
	if !ValidSlug(s) {
		// Unreachable by construction; kept so a future change cannot
		// silently produce an unsafe name.
		return "", fmt.Errorf("internal error: branch %q mapped to invalid name %q", branch, s)
	}
	return s, nil
}

// ValidSlug reports whether s is a well-formed slug.
func ValidSlug(s string) bool {
	return len(s) <= MaxSlugLen && slugRE.MatchString(s)
}
