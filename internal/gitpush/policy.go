package gitpush

import (
	"fmt"
	"strings"
)

// RefusedError is CheckBranch's answer to a push it refuses: the refs it
// may not update, each with the reason, and the branch it may push.
type RefusedError struct {
	Branch string
	Refs   []RefusedRef
}

// RefusedRef is one ref a push may not update, and why: a line meant for
// the agent, which git shows beside the ref.
type RefusedRef struct {
	Ref, Reason string
}

func (e *RefusedError) Error() string {
	parts := make([]string, len(e.Refs))
	for i, r := range e.Refs {
		parts[i] = r.Ref + ": " + r.Reason
	}
	return "push refused: " + strings.Join(parts, "; ")
}

// CheckBranch allows a push whose every update is of refs/heads/<branch>,
// byte for byte, and none a deletion; it refuses any other branch, any
// tag, any other ref (HEAD, notes, refs/for/…), and the branch's deletion,
// with a *RefusedError naming each refused ref. A force push of the branch
// is allowed: a rewrite of its own history is the agent's to make. A push
// with no updates (git's probe) changes nothing and is allowed.
func CheckBranch(updates []Update, branch string) error {
	own := "refs/heads/" + branch
	var refused []RefusedRef
	for _, u := range updates {
		if reason := refuse(u, own, branch); reason != "" {
			refused = append(refused, RefusedRef{Ref: u.Ref, Reason: reason})
		}
	}
	if len(refused) == 0 {
		return nil
	}
	return &RefusedError{Branch: branch, Refs: refused}
}

// refuse says why u may not be pushed, "" when it may.
func refuse(u Update, own, branch string) string {
	push := fmt.Sprintf("(hint: git push origin HEAD:%s)", branch)
	switch {
	case branch == "":
		return "this VM has no branch to push to"
	case u.Ref == own && u.Delete():
		return fmt.Sprintf("this VM may not delete its branch %q", branch)
	case u.Ref == own:
		return ""
	case strings.HasPrefix(u.Ref, "refs/tags/"):
		return fmt.Sprintf("this VM may not push tags, only its branch %q %s", branch, push)
	case strings.HasPrefix(u.Ref, "refs/heads/"):
		return fmt.Sprintf("this VM may push only to its own branch %q, not %q %s", branch, strings.TrimPrefix(u.Ref, "refs/heads/"), push)
	default:
		return fmt.Sprintf("this VM may push only to its own branch %q (refs/heads/%s) %s", branch, branch, push)
	}
}
