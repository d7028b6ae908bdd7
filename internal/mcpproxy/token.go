package mcpproxy

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// minTokenLen is the shortest bearer token accepted: anything shorter is
// guessable. agent-vm generates 32 random bytes, hex-encoded.
const minTokenLen = 16

// ReadToken reads the bearer token clients must present. It refuses a file
// other users can access, an empty file, and a token too short to be secret.
// Surrounding whitespace (a trailing newline) is ignored.
func ReadToken(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("reading MCP token file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("reading MCP token file: %w", err)
	}
	if perm := st.Mode().Perm(); perm&0o007 != 0 {
		return "", fmt.Errorf("MCP token file %s is accessible to other users (mode %#o) (hint: chmod 600 %s)", path, perm, path)
	}
	data, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return "", fmt.Errorf("reading MCP token file: %w", err)
	}
	tok := strings.TrimSpace(string(data))
	if err := checkToken(tok); err != nil {
		return "", fmt.Errorf("MCP token file %s: %w", path, err)
	}
	return tok, nil
}

func checkToken(tok string) error {
	switch {
	case tok == "":
		return errors.New("the token is empty (hint: write a random token into it, e.g. `openssl rand -hex 32`)")
	case len(tok) < minTokenLen:
		return fmt.Errorf("the token is shorter than %d characters, too easy to guess (hint: use `openssl rand -hex 32`)", minTokenLen)
	case len(tok) > 1024:
		return errors.New("the token is longer than 1024 characters (hint: is this the right file?)")
	}
	for _, r := range tok {
		if r <= 0x20 || r >= 0x7f {
			return errors.New("the token must be one line of visible ASCII characters, no spaces (it is sent in an HTTP header)")
		}
	}
	return nil
}

// tokenMatcher compares presented tokens with the expected one in constant
// time. Both sides are hashed first so that not even the length leaks.
type tokenMatcher struct{ want [sha256.Size]byte }

func newTokenMatcher(token string) tokenMatcher {
	return tokenMatcher{want: sha256.Sum256([]byte(token))}
}

// matchAuthorization checks an Authorization header value.
func (m tokenMatcher) matchAuthorization(header string) bool {
	scheme, tok, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	return subtle.ConstantTimeCompare(got[:], m.want[:]) == 1
}
