package repoconfig

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/secret"
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
//	mcp = ["github", "linear"]                      # the host's MCP servers mcp sync brings in
//
//	[secrets]                                       # where the user's secrets may go, narrowed
//	GH_TOKEN = ["api.github.com"]
//
// The file comes from whoever can push to the repository, so it only ever
// narrows what the user gave: a secret it names is sent to those of the
// hosts the user bound it to that the file lists (none, if it lists none
// of them), never to a host the user did not bind it to; mcp keeps the
// host's MCP servers it names and drops the others, and brings in none the
// host lacks.
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
	// Secrets narrows the hosts of the user's secrets it names; MCP, when
	// the file has it, names the host MCP servers mcp sync brings in.
	Secrets map[string][]string `toml:"secrets"`
	MCP     *[]string           `toml:"mcp"`
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
	hint := "allow, deny, requests and mcp are lists of strings, [secrets] a table of lists of host names"
	if err := c.doc().Decode(p, hint, hint, "allow, deny, requests, mcp and [secrets]"); err != nil {
		return nil, err
	}
	if err := p.checkNarrowing(c); err != nil {
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

// mcpNameRE is what an MCP server's name in mcp may be.
var mcpNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$`)

// checkNarrowing checks [secrets] (secret names and host names, as `secret
// set` takes them) and mcp (server names), and puts the hosts in their
// canonical form.
func (p *Policy) checkNarrowing(c *Config) error {
	if len(p.Secrets) > MaxPolicyEntries {
		return c.doc().Errorf("secrets", "", "%d secrets are more than %d", len(p.Secrets), MaxPolicyEntries)
	}
	for name, hosts := range p.Secrets {
		if err := secret.CheckName(name); err != nil {
			return c.doc().Errorf(name, "", "[secrets] %v", err)
		}
		for i, h := range hosts {
			n, err := secret.CheckHost(h)
			if err != nil {
				return c.doc().Errorf(name, h, "[secrets] %s: %v", name, err)
			}
			hosts[i] = n
		}
	}
	if p.MCP != nil {
		if len(*p.MCP) > MaxPolicyEntries {
			return c.doc().Errorf("mcp", "", "%d entries are more than %d", len(*p.MCP), MaxPolicyEntries)
		}
		for _, n := range *p.MCP {
			if !mcpNameRE.MatchString(n) {
				return c.doc().Errorf("mcp", n, "%q is not an MCP server's name (hint: the name a server has in the host's Claude Code configuration, e.g. \"github\")", n)
			}
		}
	}
	return nil
}
