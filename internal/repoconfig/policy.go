package repoconfig

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/wsfile"
)

// PolicyFile is the repository's network policy for its VMs, reviewable
// beside its code:
//
//	# .agent-vm/policy.toml
//	allow = ["pypi.org", "*.pythonhosted.org"]     # as `net allow` takes them
//	deny = ["telemetry.example.com"]                # as `net deny`
//	requests = [                                    # request rules, tried in order
//	  "allow PUT api.github.com/repos/o/r/pulls/*/merge",
//	  "deny POST api.github.com/repos/o/r/issues",
//	]
//
// It is read when a VM is made, from the new clone of the commit the VM
// starts at (nothing of the agent's is in it yet), and kept in the VM's
// record: the agent, who can write the workspace, cannot change its own
// policy. A file that does not parse refuses the create, naming the line.
const PolicyFile = ".agent-vm/policy.toml"

// MaxPolicyEntries bounds each list of a policy file.
const MaxPolicyEntries = 200

// Policy is what a policy file says, each entry checked and normalized as
// `net allow|deny` would.
type Policy struct {
	// Path is the file as messages name it; Sum the SHA-256 of its content.
	Path     string   `toml:"-"`
	Sum      string   `toml:"-"`
	Allow    []string `toml:"allow"`
	Deny     []string `toml:"deny"`
	Requests []string `toml:"requests"`
}

// LoadPolicy reads workspace's policy file, named name in messages; a
// repository without one gives nil. A link or a file that is not regular
// is refused, never followed.
func LoadPolicy(workspace, name string) (*Policy, error) {
	raw, err := wsfile.Read(workspace, PolicyFile, maxConfigSize)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, nil
	case errors.Is(err, wsfile.ErrNotRegular):
		return nil, fmt.Errorf("the repository's network policy %s is a symlink or not a regular file; agent-vm does not follow links in the workspace (hint: make it a plain file)", name)
	case err != nil:
		return nil, fmt.Errorf("reading the repository's network policy %s: %w", name, err)
	}
	return ParsePolicy(name, raw)
}

// ParsePolicy decodes a policy file; path is only used in messages.
func ParsePolicy(path string, raw []byte) (*Policy, error) {
	p := &Policy{Path: path}
	sum := sha256.Sum256(raw)
	p.Sum = hex.EncodeToString(sum[:])
	c := &Config{Path: path, src: string(raw)} // for its decoding and line finding
	hint := "allow, deny and requests are lists of strings"
	if err := c.doc().Decode(p, hint, hint, "allow, deny and requests"); err != nil {
		return nil, err
	}
	lists := []struct {
		key  string
		list *[]string
	}{{"allow", &p.Allow}, {"deny", &p.Deny}, {"requests", &p.Requests}}
	for _, l := range lists {
		if len(*l.list) > MaxPolicyEntries {
			return nil, c.doc().Errorf(l.key, "", "%d entries are more than %d", len(*l.list), MaxPolicyEntries)
		}
	}
	for _, l := range lists[:2] {
		for i, s := range *l.list {
			n, err := egress.CheckPattern(s)
			if err != nil {
				return nil, c.doc().Errorf(l.key, s, "%v (hint: a host name, *.example.com or an IP address, as `agent-vm net %s` takes)", err, l.key)
			}
			(*l.list)[i] = n
		}
	}
	for i, s := range p.Requests {
		rule, err := egress.ParseRequestRule(s)
		if err != nil {
			return nil, c.doc().Errorf("requests", s, "%v (hint: \"allow METHOD host/path\" or \"deny METHOD host/path\")", err)
		}
		p.Requests[i] = rule.String()
	}
	return p, nil
}
