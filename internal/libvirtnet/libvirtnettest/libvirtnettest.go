// Package libvirtnettest holds a FAKE host for tests of contained starts
// (libvirtnet.Containment and the drivers that call it), on an
// execxtest.Fake, so it stands at the exec boundary only: virsh's
// networks are a map, nft's rulesets are recorded, and the egress proxy
// writes its ports file as `agent-vm net-proxy --front` does.
// internal/libvirtnet's own tests run the network and the fence for real.
package libvirtnettest

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
)

// Ports the fake proxy says it listens on: the proxy's, and the listener of
// Network's exposed port 8080.
const (
	ProxyPort   = 40001
	ExposedPort = 40002
)

// Host is the fake host's libvirt networks, nft and egress proxy.
type Host struct {
	Nets    map[string]bool // libvirt networks, defined -> active
	Rules   []string        // the rulesets nft was given, in order
	Proxies []execxtest.Call
	// ProxyUp: the proxy writes its ports file; false, it fails at once
	// saying "net-proxy: cannot listen".
	ProxyUp bool
	// OtherVirsh answers virsh's verbs besides the networks' (a driver's
	// domstate); nil fails them.
	OtherVirsh execxtest.Handler
}

// New registers virsh, nft and agent-vm (the proxy, Network's) on f.
func New(f *execxtest.Fake) *Host {
	h := &Host{Nets: map[string]bool{}, ProxyUp: true}
	name := regexp.MustCompile(`<name>([^<]+)</name>`)
	f.On("virsh", func(c execxtest.Call) execxtest.Reply {
		args := c.Args[2:] // after -c URI
		switch args[0] {
		case "net-info":
			if active, ok := h.Nets[args[1]]; ok {
				return execxtest.Reply{Stdout: "Name: " + args[1] + "\nActive: " + map[bool]string{true: "yes", false: "no"}[active] + "\n"}
			}
			return execxtest.Reply{Stderr: "error: network not found", ExitCode: 1}
		case "net-define":
			h.Nets[string(name.FindSubmatch(c.Stdin)[1])] = false
		case "net-start":
			h.Nets[args[1]] = true
		case "net-destroy":
			h.Nets[args[1]] = false
		case "net-undefine":
			delete(h.Nets, args[1])
		default:
			if h.OtherVirsh != nil {
				return h.OtherVirsh(c)
			}
			return execxtest.Reply{Stderr: "unexpected", ExitCode: 2}
		}
		return execxtest.Reply{}
	}).On("nft", func(c execxtest.Call) execxtest.Reply {
		h.Rules = append(h.Rules, string(c.Stdin))
		return execxtest.Reply{}
	}).On("agent-vm", func(c execxtest.Call) execxtest.Reply {
		h.Proxies = append(h.Proxies, c)
		if !h.ProxyUp {
			_ = os.WriteFile(c.Stdout, []byte("net-proxy: cannot listen\n"), 0o600)
			return execxtest.Reply{ExitCode: 1}
		}
		b, _ := json.Marshal(egress.FrontPorts{Addr: after(c.Args, "--front"), Proxy: ProxyPort, Exposed: map[int]int{8080: ExposedPort}})
		_ = os.WriteFile(after(c.Args, "--front-ports"), b, 0o600)
		return execxtest.Reply{}
	})
	return h
}

// after is the argument after flag in args ("" when there is none).
func after(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// Network is a contained network as vm hands it to a driver: the proxy address
// 10.0.2.100, the proxy's port 3128, port 8080 exposed, the proxy
// `agent-vm net-proxy` over dir with "the bundle" on its standard input.
func Network(dir string) *driver.Network {
	return &driver.Network{Addr: "10.0.2.100", ProxyPort: 3128, Exposed: []int{8080}, Dir: dir,
		Proxy: []string{"/fake/agent-vm", "__net-proxy", "--dir", dir}, ProxyInput: driver.Sealed("the bundle")}
}
