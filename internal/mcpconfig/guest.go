package mcpconfig

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/agent-vm/agent-vm/internal/session"
)

// What became of a host server.
const (
	// ActionRuns: a stdio server whose program the VM has (or npx fetches).
	ActionRuns = "runs in the VM"
	// ActionNeedsInstall: a stdio server whose program the VM lacks. It is
	// written all the same, so that it works once the program is installed
	// in the VM, without another sync; until then Claude Code lists it as
	// failed.
	ActionNeedsInstall = "needs manual install in the VM"
	// ActionHostPort: a remote server on the host's loopback, reached at the
	// host's address as the guest sees it.
	ActionHostPort = "reached on the host"
	// ActionKept: a remote server elsewhere, written as it is.
	ActionKept = "kept"
	// ActionSkipped: not written (the detail says why).
	ActionSkipped = "skipped"
)

// VarPrefix starts the names of the variables that carry the host's values
// to the agent session (see Plan.Env).
const VarPrefix = "AGENT_VM_MCP_"

// Options say what the guest looks like.
type Options struct {
	// Lookup reads the host's environment (${VAR} in the host's config).
	Lookup func(string) (string, bool)
	// Home is the host user's home: paths under it (outside Project) are
	// not in the VM.
	Home string
	// Workspace is where the guest has the project (its files under
	// HostFiles.Project map there).
	Workspace string
	// HostAddr is the host's address as the guest reaches it.
	HostAddr string
	// Programs are the programs the guest's image has, by name.
	Programs []string
	// Only, when set, names the servers to bring in (the repository's
	// policy file's mcp): the others are skipped, saying why.
	Only *[]string
}

// Report says what became of one host server.
type Report struct {
	Name      string   `json:"name"`
	Scope     string   `json:"scope"`
	File      string   `json:"file"`
	Transport string   `json:"transport"` // stdio, http, sse
	Action    string   `json:"action"`
	Detail    string   `json:"detail"`
	URL       string   `json:"url,omitempty"`     // a remote server's URL in the guest
	Vars      []string `json:"vars,omitempty"`    // the session variables it needs (names)
	Missing   []string `json:"missing,omitempty"` // host variables it references that are unset
}

// Exposed is a host port the guest must reach, and why.
type Exposed struct {
	Port int    `json:"port"`
	Why  string `json:"why"`
}

// EnvVar is a value the agent session carries for the guest's config. Its
// Value is a secret: it is never written to the guest's disk.
type EnvVar = session.Var

// Plan is the guest's equivalent of a host's MCP servers.
type Plan struct {
	// Servers are the guest's mcpServers: every env and header value, and
	// every ${VAR} in args, is a ${NAME} reference to an Env variable.
	Servers map[string]Server
	Reports []Report  // one per host server, sorted by name
	Env     []EnvVar  // sorted by name; pass them to the agent session
	Exposed []Exposed // host ports the guest must reach, sorted
}

// Convert makes the guest's servers from the host's.
func Convert(h Host, o Options) Plan {
	c := converter{o: o, files: h.Files, used: map[string]bool{}, exposed: map[int][]string{}}
	p := Plan{Servers: map[string]Server{}}
	for _, e := range h.Servers {
		if o.Only != nil && !slices.Contains(*o.Only, e.Name) {
			p.Reports = append(p.Reports, Report{Name: e.Name, Scope: e.Scope, File: e.File, Transport: transport(e.Server),
				Action: ActionSkipped, Detail: "the repository's policy (mcp in .agent-vm/policy.toml) does not list it"})
			continue
		}
		srv, rep, ok := c.server(e)
		if ok {
			p.Servers[e.Name] = srv
		}
		if len(e.Dropped) > 0 {
			rep.Detail += fmt.Sprintf(" (not carried over: %s)", strings.Join(e.Dropped, ", "))
		}
		p.Reports = append(p.Reports, rep)
	}
	for _, e := range h.Shadowed {
		p.Reports = append(p.Reports, Report{Name: e.Name, Scope: e.Scope, File: e.File, Transport: transport(e.Server),
			Action: ActionSkipped, Detail: "a server of the same name in a higher scope wins"})
	}
	sort.SliceStable(p.Reports, func(i, j int) bool { return p.Reports[i].Name < p.Reports[j].Name })
	p.Env = c.env
	sort.Slice(p.Env, func(i, j int) bool { return p.Env[i].Name < p.Env[j].Name })
	for _, port := range sortedKeys(c.exposed) {
		p.Exposed = append(p.Exposed, Exposed{Port: port, Why: strings.Join(c.exposed[port], "; ")})
	}
	return p
}

type converter struct {
	o       Options
	files   HostFiles
	used    map[string]bool
	env     []EnvVar
	exposed map[int][]string
}

func transport(s Server) string {
	if s.Type == "" {
		if s.URL != "" && s.Command == "" {
			return "http"
		}
		return "stdio"
	}
	return s.Type
}

func (c *converter) server(e Entry) (Server, Report, bool) {
	rep := Report{Name: e.Name, Scope: e.Scope, File: e.File, Transport: transport(e.Server)}
	switch rep.Transport {
	case "stdio":
		if strings.TrimSpace(e.Server.Command) == "" {
			rep.Action, rep.Detail = ActionSkipped, `it has no "command"`
			return Server{}, rep, false
		}
		srv := c.stdio(e, &rep)
		return srv, rep, true
	case "http", "sse":
		if e.Server.URL == "" {
			rep.Action, rep.Detail = ActionSkipped, `it has no "url"`
			return Server{}, rep, false
		}
		srv, ok := c.remote(e, &rep)
		return srv, rep, ok
	}
	rep.Action, rep.Detail = ActionSkipped, fmt.Sprintf("type %q is not one agent-vm carries into a VM (stdio, http, sse)", rep.Transport)
	return Server{}, rep, false
}

// stdio rewrites a stdio server: project paths to the workspace, env values
// and ${VAR} in args to session variables.
func (c *converter) stdio(e Entry, rep *Report) Server {
	s := e.Server
	out := Server{Type: s.Type}
	cmd, missing := Expand(s.Command, c.o.Lookup)
	rep.Missing = append(rep.Missing, missing...)
	out.Command = c.inWorkspace(cmd)
	for _, a := range s.Args {
		out.Args = append(out.Args, c.inWorkspace(c.argRefs(e.Name, a, rep)))
	}
	out.Env = c.values(e.Name, "ENV", s.Env, rep)
	rep.Action, rep.Detail = c.classify(cmd, out, s.Args)
	rep.Missing = dedupe(rep.Missing)
	return out
}

// classify says whether the guest can run the program.
func (c *converter) classify(hostCmd string, out Server, hostArgs []string) (string, string) {
	prog := out.Command
	has := func(p string) bool {
		for _, q := range c.o.Programs {
			if q == p {
				return true
			}
		}
		return false
	}
	if strings.Contains(prog, "/") {
		switch {
		case prog != hostCmd:
			return ActionRuns, fmt.Sprintf("runs the workspace's %s", prog)
		case path.IsAbs(prog):
			return ActionNeedsInstall, fmt.Sprintf("%s is a path on the host, which the VM does not have: install the server in the VM there (or on PATH and change the command)", prog)
		}
		return ActionRuns, fmt.Sprintf("%s, relative to the directory Claude Code starts it in", prog)
	}
	for _, a := range hostArgs {
		if h := c.o.Home; h != "" && strings.HasPrefix(a, h+"/") && !c.inProject(a) {
			return ActionNeedsInstall, fmt.Sprintf("argument %s is a path on the host, which the VM does not have", a)
		}
	}
	pkg := firstOperand(out.Args)
	switch {
	case prog == "npx" && has("npx"):
		return ActionRuns, fmt.Sprintf("npx installs %s from the npm registry when Claude Code first starts it (the first start needs the network and takes a while)", pkg)
	case (prog == "uvx" || prog == "uv") && !has(prog):
		return ActionNeedsInstall, fmt.Sprintf("uv is not in the VM's image: install it in the VM (e.g. `pip install --user uv`); %s then fetches %s on first use", prog, pkg)
	case has(prog):
		return ActionRuns, prog + " is in the VM's image"
	}
	return ActionNeedsInstall, fmt.Sprintf("%s is not in the VM's image: install it in the VM", prog)
}

// firstOperand is the package an installer runs: its first argument that
// is not a flag.
func firstOperand(args []string) string {
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			return a
		}
	}
	return "the package"
}

// remote rewrites a remote server: a loopback URL to the host's address,
// header values to session variables.
func (c *converter) remote(e Entry, rep *Report) (Server, bool) {
	s := e.Server
	raw, missing := Expand(s.URL, c.o.Lookup)
	rep.Missing = append(rep.Missing, missing...)
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		rep.Action, rep.Detail = ActionSkipped, fmt.Sprintf("url %q is not an absolute http(s) URL", raw)
		return Server{}, false
	}
	out := Server{Type: s.Type}
	rep.Action, rep.Detail = ActionKept, "not on the host's loopback: the guest reaches it as the host does"
	if loopback(u.Hostname()) {
		port := u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		n, _ := strconv.Atoi(port)
		u.Host = net.JoinHostPort(c.o.HostAddr, port)
		c.exposed[n] = append(c.exposed[n], fmt.Sprintf("MCP server %q (%s scope, %s)", e.Name, e.Scope, e.File))
		rep.Action = ActionHostPort
		rep.Detail = fmt.Sprintf("on the host's loopback: the guest reaches host port %d at %s", n, c.o.HostAddr)
		if u.Scheme == "https" {
			rep.Detail += "; its TLS certificate names the loopback, not " + c.o.HostAddr + ", so verification may fail"
		}
	}
	out.URL = u.String()
	rep.URL = out.URL
	out.Headers = c.values(e.Name, "HEADER", s.Headers, rep)
	rep.Missing = dedupe(rep.Missing)
	return out, true
}

// loopback reports whether host names the host's loopback.
func loopback(host string) bool {
	if h := strings.ToLower(host); h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && (a.Unmap().IsLoopback() || a.IsUnspecified())
}

// values turns env or header values into references to session variables,
// each value expanded from the host's environment.
func (c *converter) values(server, kind string, vals map[string]string, rep *Report) map[string]string {
	if len(vals) == 0 {
		return nil
	}
	out := map[string]string{}
	for _, k := range sortedKeys(vals) {
		v, missing := Expand(vals[k], c.o.Lookup)
		rep.Missing = append(rep.Missing, missing...)
		out[k] = c.pass(server, kind+"_"+k, v, rep)
	}
	return out
}

// argRefs turns each ${VAR} in an argument into a session variable holding
// the host's value; literal text stays. A reference the host cannot resolve
// stays as written, for the guest's own environment.
func (c *converter) argRefs(server, arg string, rep *Report) string {
	return Replace(arg, func(r Ref) string {
		v, ok := c.o.Lookup(r.Name)
		switch {
		case ok:
		case r.HasDefault:
			v = r.Default
		default:
			rep.Missing = append(rep.Missing, r.Name)
			return r.Text
		}
		return c.pass(server, "ARG_"+r.Name, v, rep)
	})
}

// pass allocates a session variable for a value and returns its reference.
// Names are AGENT_VM_MCP_<SERVER>_<KIND>_<KEY>, reduced to [A-Z0-9_]; one
// that is taken (two servers whose names reduce alike) gets _2, _3 ...
func (c *converter) pass(server, key, value string, rep *Report) string {
	base := VarPrefix + varPart(server) + "_" + varPart(key)
	name := base
	for i := 2; c.used[name]; i++ {
		name = base + "_" + strconv.Itoa(i)
	}
	c.used[name] = true
	c.env = append(c.env, EnvVar{Name: name, Value: value})
	rep.Vars = append(rep.Vars, name)
	return "${" + name + "}"
}

func varPart(s string) string {
	b := []byte(strings.ToUpper(s))
	for i, ch := range b {
		if !(ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9') {
			b[i] = '_'
		}
	}
	return string(b)
}

// inWorkspace maps a path in the host's project to the workspace: a whole
// argument, or the value of a --flag=PATH one.
func (c *converter) inWorkspace(s string) string {
	if c.inProject(s) {
		return c.o.Workspace + strings.TrimPrefix(s, c.files.Project)
	}
	if flag, val, ok := strings.Cut(s, "="); ok && strings.HasPrefix(flag, "-") && c.inProject(val) {
		return flag + "=" + c.o.Workspace + strings.TrimPrefix(val, c.files.Project)
	}
	return s
}

func (c *converter) inProject(s string) bool {
	p := c.files.Project
	return p != "" && (s == p || strings.HasPrefix(s, p+"/"))
}

// dedupe sorts names and drops repeats.
func dedupe(names []string) []string {
	slices.Sort(names)
	return slices.Compact(names)
}
