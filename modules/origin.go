package modules

import (
	"fmt"
	"regexp"
	"strings"
)

// OriginPattern is the grammar of a browser origin agent-mcp can be told to
// allow (--allow-origin): http or https, a host name or a bracketed IPv6
// address, an optional port; nothing that systemd's environment files or a
// shell word list would interpret. Every consumer uses this one grammar:
// create checks it, the cloud-init seed's validator checks it, and
// agent-mcp.nix's allowOrigin option has the same text as its
// lib.types.strMatching (modules' tests compare the two, and run both
// readers on one table). It is written so that Go's regexp (anchored) and
// Nix's builtins.match (POSIX extended, whole string) read it alike: no
// backslashes, literal brackets as [[] and []].
const OriginPattern = `https?://([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|[[][0-9A-Fa-f:.]+[]])(:[0-9]{1,5})?`

var originRE = regexp.MustCompile(`^(?:` + OriginPattern + `)$`)

// CheckOrigin reports whether o matches OriginPattern. Its error starts with
// what (such as "--allow-origin"), quotes o whole, says what is wrong and how
// to write an origin.
func CheckOrigin(what, o string) error {
	if originRE.MatchString(o) {
		return nil
	}
	return fmt.Errorf("%s %q %s (hint: scheme://host[:port] with scheme http or https, such as https://claude.ai)", what, o, originProblem(o))
}

// originProblem says why o, which does not match OriginPattern, is wrong.
func originProblem(o string) string {
	for _, r := range o {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(":/.-[]", r)) {
			return fmt.Sprintf("contains %q", r)
		}
	}
	_, rest, _ := strings.Cut(o, "://")
	switch {
	case o == "":
		return "is empty"
	case !strings.HasPrefix(o, "http://") && !strings.HasPrefix(o, "https://"):
		return "is not http or https (lowercase)"
	case rest == "" || rest[0] == ':':
		return "has no host"
	case strings.Contains(rest, "/"):
		return "has more than scheme, host and port"
	}
	return "is not scheme://host[:port]"
}
