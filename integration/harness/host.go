package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// doctorReport is `agent-vm doctor --json`: what this host can do.
type doctorReport struct {
	Checks      []DoctorCheck `json:"checks"`
	Accel       string        `json:"accel"`
	AccelReason string        `json:"accel_reason"`
	AccelHint   string        `json:"accel_hint"`
	Image       string        `json:"image"`
	VMReady     bool          `json:"vm_ready"`
	Backend     string        `json:"backend"` // the backend create picks here
	// Backends are the backends whose needs this host meets.
	Backends []string `json:"backends"`
	// PackageSources are the names a VM needs for its software and its
	// agent (what `setup` pins when this host's resolver needs it).
	PackageSources []string `json:"package_sources"`
}

type DoctorCheck struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	Hint   string `json:"hint"`
}

// host is what the run learnt about agent-vm and this machine before any
// scenario ran.
type host struct {
	version string
	doctor  *doctorReport
	// noDoctor says why there is no doctor report.
	noDoctor string
	// verbs are the agent-vm commands this build has, of those asked about.
	verbs map[string]bool
}

// probeHost asks agent-vm its version, what the host can do, and which of
// verbs it has. An error means agent-vm does not run at all.
func probeHost(ctx context.Context, av *agentVM, verbs []string) (host, error) {
	h := host{verbs: map[string]bool{}}
	res := av.run(ctx, Call{Args: []string{"version"}})
	if res.ExitCode != 0 {
		res = av.run(ctx, Call{Args: []string{"--version"}})
	}
	if res.ExitCode != 0 {
		return h, &stepError{msg: fmt.Sprintf("agent-vm at %s does not run: %s", av.bin, res.Outcome()), res: res}
	}
	h.version = strings.TrimSpace(res.Stdout)

	res = av.run(ctx, Call{Args: []string{"doctor", "--json"}})
	switch {
	case res.ExitCode == 2 && strings.Contains(res.Stderr, "unknown command"):
		h.noDoctor = "this agent-vm has no `doctor` command"
	case res.ExitCode < 0:
		h.noDoctor = "`agent-vm doctor --json` " + res.Outcome()
	default:
		// doctor may exit 1 when a check fails; its JSON still says what.
		var d doctorReport
		if err := json.Unmarshal([]byte(res.Stdout), &d); err != nil {
			h.noDoctor = fmt.Sprintf("`agent-vm doctor --json` (%s) printed no JSON report: %v", res.Outcome(), err)
		} else {
			h.doctor = &d
		}
	}

	// agent-vm lists a command in --help only once it works.
	res = av.run(ctx, Call{Args: []string{"--help"}, Quiet: true})
	listed := helpCommands(res.Stdout)
	for _, v := range verbs {
		if listed != nil {
			h.verbs[v] = listed[v]
			continue
		}
		res := av.run(ctx, Call{Args: []string{v, "--help"}, Quiet: true})
		h.verbs[v] = res.ExitCode == 0
	}
	return h, ctx.Err()
}

// helpCommands reads the COMMANDS section of `agent-vm --help`: each line
// starts with a command's name and its aliases ("list, ls   list the VMs"),
// under a category's heading ("VMs:") when the commands have categories.
// It returns nil when there is no such section.
func helpCommands(help string) map[string]bool {
	var cmds map[string]bool
	for _, line := range strings.Split(help, "\n") {
		switch {
		case strings.TrimSpace(line) == "COMMANDS:":
			cmds = map[string]bool{}
		case cmds == nil:
		case strings.TrimSpace(line) == "" || !strings.HasPrefix(line, " "):
			return cmds
		case strings.HasSuffix(line, ":") && !strings.Contains(strings.TrimSpace(line), "  "):
			// a category's heading
		default:
			names, _, _ := strings.Cut(strings.TrimSpace(line), "  ")
			for _, n := range strings.Split(names, ",") {
				cmds[strings.TrimSpace(n)] = true
			}
		}
	}
	return cmds
}

// missingVerbs lists the verbs of need that this agent-vm lacks.
func (h host) missingVerbs(need []string) []string {
	var out []string
	for _, v := range need {
		if !h.verbs[v] {
			out = append(out, v)
		}
	}
	sort.Strings(out)
	return out
}

// backendSkip says why VMs of backend (a --backend other than auto)
// cannot boot here, naming the failed checks; "" when they can (or when
// this agent-vm's doctor does not list its backends).
func (h host) backendSkip(backend string) string {
	if h.doctor == nil || h.doctor.Backends == nil || backend == "" || backend == "auto" || slices.Contains(h.doctor.Backends, backend) {
		return ""
	}
	var failed []string
	for _, c := range h.doctor.Checks {
		if !c.OK {
			s := c.Name
			if c.Hint != "" {
				s += " (hint: " + c.Hint + ")"
			}
			failed = append(failed, s)
		}
	}
	return fmt.Sprintf("`agent-vm doctor` says the %s backend cannot run here (it can run: %s); failed checks: %s", backend, strings.Join(h.doctor.Backends, ", "), strings.Join(failed, "; "))
}

// vmSkip says why VMs cannot boot here and what would change that; ""
// when they can.
func (h host) vmSkip() string {
	if h.doctor == nil {
		return "cannot tell whether this host can boot VMs: " + h.noDoctor
	}
	if h.doctor.VMReady {
		return ""
	}
	var reasons []string
	imageNamed := false
	for _, c := range h.doctor.Checks {
		if c.OK {
			continue
		}
		s := c.Name
		if c.Detail != "" {
			s += ": " + c.Detail
		}
		if c.Hint != "" {
			s += " (hint: " + c.Hint + ")"
		}
		imageNamed = imageNamed || strings.Contains(strings.ToLower(c.Name+c.Detail+c.Hint), "image")
		reasons = append(reasons, s)
	}
	if h.doctor.Image == "" && !imageNamed {
		reasons = append(reasons, "no base image (hint: `sudo agent-vm image build`)")
	}
	if len(reasons) == 0 {
		reasons = append(reasons, "`agent-vm doctor` says VMs cannot boot here (run it for details)")
	}
	return strings.Join(reasons, "; ")
}

// describe is the header's account of the host.
func (h host) describe() []string {
	if h.doctor == nil {
		return []string{"unknown: " + h.noDoctor}
	}
	d := h.doctor
	accel := "accel " + d.Accel
	if d.AccelReason != "" {
		accel += " (" + d.AccelReason + ")"
	}
	lines := []string{accel}
	if d.Image != "" {
		lines = append(lines, "base image "+d.Image)
	} else {
		lines = append(lines, "no base image")
	}
	if skip := h.vmSkip(); skip != "" {
		lines = append(lines, "VMs cannot boot here: "+skip)
	} else {
		lines = append(lines, "VMs can boot here")
	}
	return lines
}
