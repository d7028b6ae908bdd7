// Package tomlfile decodes agent-vm's TOML files strictly: a syntax error,
// a value of the wrong type and a key agent-vm does not read are errors
// that name the file and the line, with a hint, as are the checks the
// caller makes of a value (Errorf). The repository's files
// (internal/repoconfig) and the user's (internal/userconfig) are read so.
package tomlfile

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/BurntSushi/toml"
)

// Doc is a TOML file's source, named Path in messages.
type Doc struct {
	Path string
	Src  string
}

// Decode decodes the source into v strictly: a syntax error, a wrong type
// and an unknown key are errors naming the file and line, with the hints
// for each (what the file's keys are, what their types are, which keys
// agent-vm reads).
func (d Doc) Decode(v any, syntaxHint, typeHint, keys string) error {
	md, err := toml.Decode(d.Src, v)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return fmt.Errorf("%s:%d: %s (hint: %s)", d.Path, pe.Position.Line, pe.Message, syntaxHint)
		}
		// A type mismatch is not a ParseError; its text has the line.
		if m := typeErrRE.FindStringSubmatch(err.Error()); m != nil {
			return fmt.Errorf("%s:%s: %s: %s (hint: %s)", d.Path, m[1], m[2], m[3], typeHint)
		}
		return fmt.Errorf("%s: %w", d.Path, err)
	}
	if un := md.Undecoded(); len(un) > 0 {
		key := un[0].String()
		return d.Errorf(key, "", "unknown key %q (hint: agent-vm reads %s)", key, keys)
	}
	return nil
}

// typeErrRE reads BurntSushi/toml's "incompatible types" error.
var typeErrRE = regexp.MustCompile(`^toml: line (\d+) \(last key "([^"]*)"\): (.*)$`)

// Errorf is an error about key (and, when given, the quoted value inside
// it) at the line where it stands.
func (d Doc) Errorf(key, value, format string, args ...any) error {
	return fmt.Errorf("%s:%d: %s", d.Path, d.Line(key, value), fmt.Sprintf(format, args...))
}

// Line finds where key is set: the line of value within it when given
// (a multi-line array), else the key's own line; 1 when neither is found.
func (d Doc) Line(key, value string) int {
	keyRE := regexp.MustCompile(`^\s*"?` + regexp.QuoteMeta(key) + `"?\s*=`)
	lines := strings.Split(d.Src, "\n")
	for i, l := range lines {
		if !keyRE.MatchString(l) {
			continue
		}
		if value == "" {
			return i + 1
		}
		for j := i; j < len(lines); j++ {
			if strings.Contains(lines[j], `"`+value+`"`) || strings.Contains(lines[j], `'`+value+`'`) {
				return j + 1
			}
		}
		return i + 1
	}
	return 1
}
