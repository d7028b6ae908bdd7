package testutil

import (
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// hostsScript bind-mounts its first argument on /etc/hosts and its second
// on /etc/nsswitch.conf (when the machine has one to cover), then runs
// the rest. mount is looked for in the system's directories, not the
// caller's PATH, which the program run keeps.
const hostsScript = `set -e
h=$1; n=$2; shift 2
sys=/usr/sbin:/usr/bin:/sbin:/bin
PATH=$sys mount --bind "$h" /etc/hosts
if [ -e /etc/nsswitch.conf ]; then PATH=$sys mount --bind "$n" /etc/nsswitch.conf; fi
exec "$@"`

// InHosts is argv made to run in a private mount namespace whose
// /etc/hosts lists hosts alone, and whose resolver reads that file alone
// (/etc/nsswitch.conf says "hosts: files"): a process with Go's own
// resolver (a CGO_ENABLED=0 binary, as AgentVMBinary builds) resolves
// those names to those addresses and no other name, and the machine's
// files stay as they are. It needs root and unshare: the test is skipped
// (or fails under AGENT_VM_TEST_STRICT=1) without them.
func InHosts(t testing.TB, hosts map[string]netip.Addr, argv ...string) []string {
	t.Helper()
	Need(t, os.Geteuid() == 0, "a mount namespace of its own needs root")
	unshare, sh := Program(t, "unshare"), Program(t, "sh")
	if _, err := os.Stat("/etc/hosts"); err != nil {
		SkipOrFail(t, "no /etc/hosts to cover: %v", err)
	}
	dir := t.TempDir()
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(hosts)) {
		fmt.Fprintf(&b, "%s\t%s\n", hosts[name], name)
	}
	h, n := filepath.Join(dir, "hosts"), filepath.Join(dir, "nsswitch.conf")
	WriteFile(t, h, b.String())
	WriteFile(t, n, "hosts: files\n")
	return append([]string{unshare, "--mount", "--propagation", "private", sh, "-c", hostsScript, "sh", h, n}, argv...)
}
