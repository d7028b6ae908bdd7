package hostbrowser

import (
	"context"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/bridge"
	"github.com/agent-vm/agent-vm/internal/execx"
)

// The ways `run --chrome` reaches a host browser, in the order it tries
// them.
const (
	ViaBridge   = "Claude in Chrome bridge"
	ViaDevTools = "DevTools (host Chrome at 127.0.0.1:9222)"
	ViaLaunch   = "DevTools after agent-vm browser BRANCH --launch"
)

// NoBrowserHint is what a host with no way to a browser does.
const NoBrowserHint = bridge.ChromeSetupHint + "; or install Chromium and run agent-vm browser BRANCH --launch"

// Facts are doctor's view of the host's browser. Each part is found
// (Bridge, Binary, DevTools) or says why not (its Problem).
type Facts struct {
	Bridge        string `json:"bridge,omitempty"` // the Claude in Chrome bridge socket
	BridgeProblem string `json:"bridge_problem,omitempty"`
	Binary        string `json:"binary,omitempty"` // a Chrome or Chromium
	Version       string `json:"version,omitempty"`
	BinaryProblem string `json:"binary_problem,omitempty"`
	// DevTools is what answers on 127.0.0.1:DefaultPort.
	DevTools        *bridge.DevTools `json:"devtools,omitempty"`
	DevToolsProblem string           `json:"devtools_problem,omitempty"`
	// Chrome is the way `run --chrome` would take: one of the Via
	// constants, or "none: " and what to do.
	Chrome string `json:"chrome"`
}

// Doctor looks at the host's browser: the bridge socket (in the directory
// bridge.ChromeBridgeDir names with getenv), a browser on PATH and its
// version, and a DevTools endpoint on 127.0.0.1:DefaultPort.
func Doctor(ctx context.Context, run execx.Runner, getenv func(string) string) Facts {
	return doctor(ctx, run, getenv, bridge.DevToolsAddr(DefaultPort))
}

func doctor(ctx context.Context, run execx.Runner, getenv func(string) string, devtools string) Facts {
	var f Facts
	if dir, err := bridge.ChromeBridgeDir(getenv); err != nil {
		f.BridgeProblem = err.Error()
	} else if sock, err := bridge.FindChromeBridge(dir); err != nil {
		f.BridgeProblem = err.Error()
	} else {
		f.Bridge = sock
	}
	if bin, err := Find(run); err != nil {
		f.BinaryProblem = err.Error()
	} else {
		f.Binary = bin
		vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		res, err := run.Run(vctx, execx.Cmd{Path: bin, Args: []string{"--version"}})
		cancel()
		if err != nil {
			f.BinaryProblem = err.Error()
		} else {
			f.Version, _, _ = strings.Cut(strings.TrimSpace(string(res.Stdout)), "\n")
		}
	}
	if d, err := bridge.ProbeDevTools(ctx, devtools); err != nil {
		f.DevToolsProblem = err.Error()
	} else {
		f.DevTools = &d
	}
	switch {
	case f.Bridge != "":
		f.Chrome = ViaBridge
	case f.DevTools != nil:
		f.Chrome = ViaDevTools
	case f.Binary != "" && f.BinaryProblem == "":
		f.Chrome = ViaLaunch
	default:
		f.Chrome = "none: " + NoBrowserHint
	}
	return f
}
