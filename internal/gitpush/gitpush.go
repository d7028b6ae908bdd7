// Package gitpush reads and judges the ref updates of a git push over
// smart HTTP: the command list at the head of a `POST …/git-receive-pack`
// request body (application/x-git-receive-pack-request), read as a stream
// so that the pack behind it is never held in memory (ReadCommands); the
// rule that a VM may only update its own branch (CheckBranch); and the
// answer that makes git show the agent why its push was refused
// (WriteRefusal). It is pure: the egress proxy feeds it request bodies and
// forwards or refuses.
//
// The request's grammar is git's (Documentation/gitprotocol-pack.txt):
// optional "shallow <oid>" lines, then pkt-lines "<old-oid> SP <new-oid>
// SP <refname>" (the first with NUL and the capabilities after the
// refname) ended by a flush-pkt, then, unless every command is a
// deletion, the packfile. A request that is nothing but a flush-pkt is
// git's probe before a large push: no updates, nothing to refuse.
//
// Signed pushes (a push-cert block instead of the command list) are
// refused rather than read: a server only asks for them when configured
// to (receive.certNonceSeed), and the commands inside a certificate are a
// second grammar whose every reading would have to agree with
// receive-pack's for the check to hold. `git push` without --signed works.
package gitpush

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// maxCommandBytes bounds the command section ReadCommands keeps to replay:
// about 7,000 ref updates of SHA-1 ids, far more than a branch's push.
const maxCommandBytes = 1 << 20

// Update is one ref update of a push: Old and New are lowercase hex object
// ids (40 digits for SHA-1, 64 for SHA-256), all zeros for "none".
type Update struct {
	Old, New string
	Ref      string
}

// Create says the update makes a ref that did not exist (its old id is zero).
func (u Update) Create() bool { return isZero(u.Old) }

// Delete says the update deletes the ref (its new id is zero).
func (u Update) Delete() bool { return isZero(u.New) }

// Push is the command section of a push request.
type Push struct {
	Updates []Update
	// Capabilities are what the client asked for on its first command
	// line ("report-status", "side-band-64k", "object-format=sha256", ...).
	Capabilities []string
}

// Has says whether the client asked for capability c (a name, or
// name=value exactly).
func (p Push) Has(c string) bool { return slices.Contains(p.Capabilities, c) }

// ReadCommands reads the command section of a receive-pack request body,
// up to and including its flush-pkt, and returns the updates it asks for
// with replay, a reader of the whole body as it was: the bytes read
// followed by the rest of body, unread (the pack, streamed, never
// buffered). The proxy forwards replay unchanged when the push is allowed.
// replay is there even when err is not nil, to drain or forward.
//
// body is the request body as sent: a request with a Content-Encoding
// must be refused before (git does not compress what it pushes).
func ReadCommands(body io.Reader) (push Push, replay io.Reader, err error) {
	rec := &recorder{r: body}
	push, err = readCommands(&pktReader{r: rec})
	return push, io.MultiReader(bytes.NewReader(rec.buf), body), err
}

// readCommands parses the pkt-lines of the command section.
func readCommands(pr *pktReader) (Push, error) {
	var push Push
	hexLen := 0 // the object ids' length, fixed by the first command
	for first := true; ; {
		line, err := pr.next()
		if errors.Is(err, errFlush) {
			return push, nil
		}
		if errors.Is(err, io.EOF) {
			return push, errors.New("the push request ends before its command list's flush-pkt")
		}
		if err != nil {
			return push, err
		}
		line = bytes.TrimSuffix(line, []byte("\n"))
		if bytes.HasPrefix(line, []byte("push-cert")) && first {
			return push, errors.New("signed pushes are refused here (hint: push without --signed)")
		}
		if oid, ok := bytes.CutPrefix(line, []byte("shallow ")); ok && first {
			if !isHex(string(oid)) || (len(oid) != 40 && len(oid) != 64) {
				return push, fmt.Errorf("shallow line %q: not an object id", line)
			}
			continue
		}
		cmd, caps, hasCaps := bytes.Cut(line, []byte{0})
		if hasCaps && !first {
			return push, fmt.Errorf("command %q: only the first command line may carry capabilities", cmd)
		}
		if first {
			push.Capabilities = strings.Fields(string(caps))
			hexLen = 40
			if push.Has("object-format=sha256") {
				hexLen = 64
			}
			first = false
		}
		u, err := parseCommand(string(cmd), hexLen)
		if err != nil {
			return push, err
		}
		push.Updates = append(push.Updates, u)
	}
}

// parseCommand parses "<old-oid> SP <new-oid> SP <refname>" with ids of
// hexLen lowercase hex digits.
func parseCommand(cmd string, hexLen int) (Update, error) {
	old, rest, ok1 := strings.Cut(cmd, " ")
	newID, ref, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || ref == "" {
		return Update{}, fmt.Errorf("command %q is not \"<old-id> <new-id> <ref>\"", cmd)
	}
	for _, id := range []string{old, newID} {
		if len(id) != hexLen || !isHex(id) {
			return Update{}, fmt.Errorf("command %q: %q is not an object id of %d lowercase hex digits", cmd, id, hexLen)
		}
	}
	u := Update{Old: old, New: newID, Ref: ref}
	if u.Create() && u.Delete() {
		return Update{}, fmt.Errorf("command %q neither creates nor deletes nor updates a ref (both ids are zero)", cmd)
	}
	return u, nil
}

// isHex says whether s is all lowercase hex digits.
func isHex(s string) bool {
	for i := range len(s) {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// isZero says whether id is the zero object id.
func isZero(id string) bool { return strings.Trim(id, "0") == "" }

// recorder keeps every byte read through it, up to maxCommandBytes.
type recorder struct {
	r   io.Reader
	buf []byte
}

func (c *recorder) Read(p []byte) (int, error) {
	if len(c.buf)+len(p) > maxCommandBytes {
		return 0, fmt.Errorf("the push's command list is over %d KiB (hint: push fewer refs at a time)", maxCommandBytes>>10)
	}
	n, err := c.r.Read(p)
	c.buf = append(c.buf, p[:n]...)
	return n, err
}
