package scenario

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/integration/harness"
)

func sessionsScenario() harness.Scenario {
	return harness.Scenario{
		Name:    "sessions",
		Summary: "run makes, boots and attaches to a stand-in agent; detach, sessions, fork and checkpoint at work, suspend at work (paused in place) and resume, attach with scrollback, exit status, a secret that reaches only the agent, rollback to the checkpoint",
		NeedsVM: true,
		// Its VMs' first boot is not what it checks.
		Template: "none",
		Verbs:    []string{"run", "attach", "sessions", "fork", "checkpoint", "rollback", "suspend", "resume", "logs", "status", "stop", "destroy"},
		Run:      runSessions,
	}
}

const sessionsBranch = "itest/sessions"

// standInAgent is the agent the scenario runs: it proves it got the secret
// by writing its hash (never the value) to the workspace, which the host
// sees, says it waits for the user as an agent's hook would, then waits for
// a line and exits with it as its status.
const standInAgent = `#!/bin/sh
# A stand-in for a coding agent (agent-vm's integration test).
sum=$(printf %s "$AGENT_VM_CANARY" | sha256sum | cut -d' ' -f1)
echo "stand-in agent: args [$*], canary sha256 $sum"
# What Claude Code's Notification hook does: agent-vm agent-state reads its payload.
echo '{"hook_event_name":"Notification","message":"stand-in asks: an exit status?"}' | agent-vm agent-state
printf '%s\n' "$sum" > .agent-ready
echo "waiting for an exit status"
read -r status
echo "stand-in agent ends with status $status"
exit "$status"
`

// sessionInfo is one entry of `sessions --json`.
type sessionInfo struct {
	Name     string `json:"name"`
	Command  string `json:"command"`
	Attached int    `json:"attached"`
	Exited   bool   `json:"exited"`
	Status   int    `json:"status"`
	State    string `json:"state"`
	From     string `json:"state_from"`
	Message  string `json:"message"`
}

// detachKeys are tmux's Ctrl-b d.
const detachKeys = "\x02d"

// runSessions drives `run` as a user at a terminal would, with a pipe for
// the keyboard: agent-vm gives the guest side a PTY either way.
func runSessions(ctx context.Context, s *harness.S) {
	canary := "agent-vm-canary-" + harness.RandHex(12)
	canaryEnv := []string{"AGENT_VM_CANARY=" + canary}
	sum := sha256.Sum256([]byte(canary))
	wantSum := hex.EncodeToString(sum[:])
	var rp *harness.Repo
	var ref harness.VMRef
	var workspace string
	var calls []*harness.Result // every call, searched for the canary at the end
	track := func(r *harness.Result) *harness.Result { calls = append(calls, r); return r }
	// --on-wait's command writes what it was told where the test reads it.
	onWaitOut := filepath.Join(s.Dir(), "on-wait.out")
	agentArgs := []string{"--agent", "./stand-in-agent", "--env", "AGENT_VM_CANARY",
		"--on-wait", `printf '%s|%s|%s\n' "$AGENT_VM_SESSION" "$AGENT_VM_STATE" "$AGENT_VM_MESSAGE" >> '` + onWaitOut + `'`}
	if s.Backend() != "" {
		agentArgs = append(agentArgs, "--backend", s.Backend())
	}
	if s.Host() != "" {
		agentArgs = append(agentArgs, "--host", s.Host())
	}

	s.Step(ctx, "refusals: an unset --env, an --agent with spaces, attach to a VM that does not exist", func() (err error) {
		if rp, err = harness.NewRepo(ctx, s.Dir(), map[string]string{"stand-in-agent": standInAgent}); err != nil {
			return err
		}
		if err := os.Chmod(filepath.Join(rp.Dir, "stand-in-agent"), 0o755); err != nil {
			return err
		}
		if _, err := harness.Git(ctx, rp.Dir, "add", "stand-in-agent"); err != nil {
			return err
		}
		if _, err := harness.Git(ctx, rp.Dir, "commit", "-qm", "the stand-in agent is executable"); err != nil {
			return err
		}
		ref = harness.VMRef{Branch: sessionsBranch, Dir: rp.Dir}
		for _, tc := range []struct {
			args []string
			code int
			want string
		}{
			{[]string{"run", sessionsBranch, "--agent", "./stand-in-agent", "--env", "AGENT_VM_NOT_SET_ANYWHERE"}, 1, "AGENT_VM_NOT_SET_ANYWHERE is not set"},
			{[]string{"run", sessionsBranch, "--agent", "claude --yolo"}, 1, "give one program"},
			{[]string{"run", sessionsBranch, "extra", "--agent", "./stand-in-agent"}, 2, "the agent's arguments go after --"},
			{[]string{"attach", sessionsBranch}, 1, "no VM for branch"},
		} {
			res := track(s.Call(ctx, harness.Call{Args: tc.args, Dir: rp.Dir}))
			if err := harness.Want(res, tc.code); err != nil {
				return err
			}
			if !strings.Contains(res.Stderr, tc.want) {
				return harness.Failf(res, "the refusal does not say %q", tc.want)
			}
		}
		// Nothing was made by the refusals.
		res := track(s.Call(ctx, harness.Call{Args: []string{"list", "--json"}}))
		if strings.Contains(res.Stdout, sessionsBranch) {
			return harness.Failf(res, "a refused run left a VM behind")
		}
		return nil
	})

	// The first run creates and boots the VM, starts the agent and attaches;
	// the keyboard detaches once the agent is ready.
	s.Step(ctx, "run creates and boots the VM, attaches to the agent, and Ctrl-b d detaches", func() error {
		args := append([]string{"run", sessionsBranch}, agentArgs...)
		args = append(args, "--", "first", "second arg")
		kbd, done, err := typing(ctx, s, harness.Call{Args: args, Dir: rp.Dir, Env: canaryEnv})
		if err != nil {
			return err
		}
		s.Register(sessionsBranch, rp.Dir)
		ready, err := waitAgentReady(ctx, s, rp.Dir, &workspace, done)
		if err != nil {
			kbd.Close()
			return err
		}
		if ready != wantSum {
			kbd.Close()
			return harness.Failf(nil, "the agent saw a different canary: sha256 %q, want %q", ready, wantSum)
		}
		// The guest's process list does not show the value.
		ps := track(s.Call(ctx, harness.Call{Args: []string{"exec", sessionsBranch, "--", "ps", "-eo", "args"}, Dir: rp.Dir}))
		if err := harness.Want(ps, 0); err != nil {
			kbd.Close()
			return err
		}
		psLeak := strings.Contains(ps.Stdout, canary)
		kbd.Type(detachKeys)
		res := track(<-done)
		kbd.Close()
		if err := harness.Want(res, 0); err != nil {
			return err
		}
		if psLeak {
			return harness.Failf(ps, "the canary is in the guest's process list")
		}
		if !strings.Contains(res.Stderr, "creating one") || !strings.Contains(res.Stderr, "detached from session") {
			return harness.Failf(res, "run did not say it created the VM and that the user detached")
		}
		if !strings.Contains(res.Stdout, "args [first second arg]") {
			return harness.Failf(res, "the terminal did not show the agent's output with its arguments")
		}
		return nil
	})

	var name string
	s.Step(ctx, "top shows the VM with its agent waiting, in 80x24 and in --json; q quits", func() error {
		return topSteps(ctx, s, ref)
	})
	s.Step(ctx, "sessions lists the detached agent, waiting as its hook said; a running session is not removed without --force", func() error {
		infos, err := sessions(ctx, s, ref)
		if err != nil {
			return err
		}
		if len(infos) != 1 || infos[0].Exited || infos[0].Attached != 0 || !strings.Contains(infos[0].Command, "stand-in-agent") {
			return harness.Failf(s.LastResult(), "sessions: %+v, want one detached, running stand-in-agent", infos)
		}
		if in := infos[0]; in.State != "waiting" || in.From != "hooks" || in.Message != "stand-in asks: an exit status?" {
			return harness.Failf(s.LastResult(), "sessions: the agent's state %q from %q, message %q; want waiting from its hook", in.State, in.From, in.Message)
		}
		// The VM's holder saw it turn waiting and ran run --on-wait's command here.
		want := infos[0].Name + "|waiting|stand-in asks: an exit status?\n"
		if err := s.Until(ctx, "run --on-wait's command", func() (bool, error) {
			b, err := os.ReadFile(onWaitOut)
			return string(b) == want, fmt.Errorf("%s has %q, %v; want %q", onWaitOut, b, err, want)
		}); err != nil {
			return err
		}
		name = infos[0].Name
		res := track(s.Call(ctx, harness.Call{Args: []string{"sessions", "rm", sessionsBranch, "--session", name}, Dir: rp.Dir}))
		if err := harness.Want(res, 1); err != nil {
			return err
		}
		if !strings.Contains(res.Stderr, "still running") {
			return harness.Failf(res, "the refusal does not say the agent still runs")
		}
		res = track(s.Call(ctx, harness.Call{Args: []string{"attach", sessionsBranch, "--session", "no-such-session"}, Dir: rp.Dir}))
		if err := harness.Want(res, 1); err != nil {
			return err
		}
		if !strings.Contains(res.Stderr, name) {
			return harness.Failf(res, "attach to an unknown session does not list the sessions there are")
		}
		return nil
	})

	forkSkip := ""
	if s.Backend() != "" && s.Backend() != "qemu" || s.Host() != "" {
		forkSkip = "fork copies the qemu backend's VMs of this machine"
	}
	s.StepUnless(ctx, "fork with the agent at work: the VM pauses for the copy and the session runs on; the fork is stopped, on its branch, with the agent's file", forkSkip, func() error {
		return forkAtWork(ctx, s, ref, name, wantSum, track)
	})

	s.StepUnless(ctx, "checkpoint with the agent at work: the VM pauses for the copy and the session runs on; files and the disk change after it", forkSkip, func() error {
		return checkpointAtWork(ctx, s, ref, name, track)
	})

	s.Step(ctx, "suspend with the agent at work pauses the VM in place; resume brings back the same session", func() error {
		return suspendAtWork(ctx, s, ref, name, track)
	})

	hibernateSkip := strings.Replace(forkSkip, "fork copies", "hibernation moves the memory of", 1)
	s.StepUnless(ctx, "idle_suspend: the VM, its agent waiting, hibernates by itself; a request to its MCP port wakes it, exec wakes it from suspend --hibernate; the session runs on", hibernateSkip, func() error {
		return hibernateIdle(ctx, s, ref, name, track)
	})

	s.Step(ctx, "run again re-attaches to the same agent (the screen comes back); its exit status becomes agent-vm's", func() error {
		res, err := runAndAnswer(ctx, s, ref, harness.Call{Args: append([]string{"run", sessionsBranch}, agentArgs...), Dir: rp.Dir, Env: canaryEnv}, 7)
		if err != nil {
			return err
		}
		if err := harness.Want(track(res), 7); err != nil {
			return err
		}
		if !strings.Contains(res.Stdout, "waiting for an exit status") {
			return harness.Failf(res, "re-attaching did not show the agent's earlier output")
		}
		if !strings.Contains(res.Stderr, "ended (exit status 7)") {
			return harness.Failf(res, "run does not say the agent ended with status 7")
		}
		return nil
	})

	s.Step(ctx, "sessions shows the exit status, logs --session the scrollback, attach the end", func() error {
		infos, err := sessions(ctx, s, ref)
		if err != nil {
			return err
		}
		if len(infos) != 1 || !infos[0].Exited || infos[0].Status != 7 {
			return harness.Failf(s.LastResult(), "sessions: %+v, want one session that exited with 7 (and no second one)", infos)
		}
		res := track(s.Call(ctx, harness.Call{Args: []string{"logs", sessionsBranch, "--session", name}, Dir: rp.Dir}))
		if err := harness.Want(res, 0); err != nil {
			return err
		}
		for _, w := range []string{"args [first second arg]", "stand-in agent ends with status 7"} {
			if !strings.Contains(res.Stdout, w) {
				return harness.Failf(res, "logs --session lacks %q", w)
			}
		}
		res = track(s.Call(ctx, harness.Call{Args: []string{"attach", sessionsBranch}, Dir: rp.Dir}))
		if err := harness.Want(res, 7); err != nil {
			return err
		}
		if !strings.Contains(res.Stdout, "ends with status 7") {
			return harness.Failf(res, "attach to an ended session does not show its end")
		}
		return nil
	})

	s.Step(ctx, "run of an ended session starts it anew; a program the VM lacks and agent-vm cannot install is refused", func() error {
		res := track(s.Call(ctx, harness.Call{Args: []string{"run", sessionsBranch, "--agent", "no-such-agent-program"}, Dir: rp.Dir}))
		if err := harness.Want(res, 1); err != nil {
			return err
		}
		if !strings.Contains(res.Stderr, "has no program no-such-agent-program, and it is not an agent agent-vm knows") {
			return harness.Failf(res, "run of a missing program does not say the VM lacks it")
		}
		res, err := runAndAnswer(ctx, s, ref, harness.Call{Args: append([]string{"run", sessionsBranch}, agentArgs...), Dir: rp.Dir, Env: canaryEnv}, 3)
		if err != nil {
			return err
		}
		if err := harness.Want(track(res), 3); err != nil {
			return err
		}
		if !strings.Contains(res.Stderr, "session "+name+" had ended (exit status 7); starting it again") {
			return harness.Failf(res, "run does not say it starts the ended session again")
		}
		infos, err := sessions(ctx, s, ref)
		if err != nil {
			return err
		}
		if len(infos) != 1 || infos[0].Name != name || !infos[0].Exited || infos[0].Status != 3 {
			return harness.Failf(s.LastResult(), "sessions: %+v, want the one session, ended anew with 3", infos)
		}
		res = track(s.Call(ctx, harness.Call{Args: []string{"sessions", "rm", sessionsBranch, "--session", name}, Dir: rp.Dir}))
		return harness.Want(res, 0)
	})

	s.Step(ctx, "the secret is nowhere: not in status, logs, the state directory or the guest's disk after stop", func() error {
		res := track(s.Call(ctx, ref.Call("status", "--json")))
		if err := harness.Want(res, 0); err != nil {
			return err
		}
		track(s.Call(ctx, ref.Call("logs", "-n", "5000")))
		if _, err := s.Stop(ctx, sessionsBranch); err != nil {
			return err
		}
		for _, r := range calls {
			if strings.Contains(r.Stdout, canary) || strings.Contains(r.Stderr, canary) {
				return harness.Failf(r, "the canary is in the output of `%s`", r.Short())
			}
		}
		hits, scanned, err := harness.GrepTree(s.StateDir(), []byte(canary))
		if err != nil {
			return err
		}
		if len(hits) > 0 {
			return harness.Failf(nil, "the canary is in %s", strings.Join(hits, ", "))
		}
		s.Notef("canary absent from %d files (%s) of the state directory, incl. the guest disk", scanned.Files, humanBytes(scanned.Bytes))
		return nil
	})

	s.StepUnless(ctx, "rollback of the stopped VM to the checkpoint, and the start after: the file deleted since is back, those made since are gone, on the disk too", forkSkip, func() error {
		return rollbackToIt(ctx, s, ref, track)
	})

	s.Step(ctx, "destroy removes the VM", func() error {
		res := s.Call(ctx, ref.Call("destroy", "--force"))
		return harness.Want(res, 0)
	})
}

// suspendAtWork suspends the VM while its agent session runs in
// /workspace: suspend pauses it in place (it cannot be saved with the
// workspace in use) and says so, status says suspended (paused), and after
// resume the session is there, still running (the next step attaches to
// it and finds its earlier screen).
func suspendAtWork(ctx context.Context, s *harness.S, ref harness.VMRef, name string, track func(*harness.Result) *harness.Result) error {
	res := track(s.Call(ctx, ref.Call("suspend")))
	if err := harness.Want(res, 0); err != nil {
		return err
	}
	if !strings.Contains(res.Stdout, "in place") {
		return harness.Failf(res, "suspend with an agent at work in /workspace does not say it paused the VM in place")
	}
	res = track(s.Call(ctx, ref.Call("status", "--json")))
	if err := harness.Want(res, 0); err != nil {
		return err
	}
	st, err := harness.ParseStatus([]byte(res.Stdout), harness.StatusKeys())
	if err != nil {
		return harness.Failf(res, "%v", err)
	}
	if st.State != "suspended" || st.Suspend != "paused" || st.Agent.State == "unhealthy" {
		return harness.Failf(res, "after suspend: state %q, suspend %q, agent %q; want suspended, paused, and no unhealthy agent", st.State, st.Suspend, st.Agent.State)
	}
	if err := harness.Want(track(s.Call(ctx, ref.Call("resume"))), 0); err != nil {
		return err
	}
	infos, err := sessions(ctx, s, ref)
	if err != nil {
		return err
	}
	if len(infos) != 1 || infos[0].Name != name || infos[0].Exited {
		return harness.Failf(s.LastResult(), "sessions after resume: %+v, want %s, still running", infos, name)
	}
	return nil
}

// hibernateIdle sets a short idle_suspend in the scenario's settings: the
// VM, whose agent waits with nobody attached and an HTTP client's
// connection kept open and quiet, hibernates by itself; a request to
// agent-mcp's port on a new connection wakes it (the holder sees the
// connection and runs resume) and is answered, and the kept connection is
// still there; the agent's session runs on. Then suspend --hibernate, and
// exec wakes it.
func hibernateIdle(ctx context.Context, s *harness.S, ref harness.VMRef, name string, track func(*harness.Result) *harness.Result) error {
	st, _, err := s.Status(ctx, ref.Branch, harness.StatusKeys())
	if err != nil {
		return err
	}
	health := fmt.Sprintf("http://127.0.0.1:%d/health", st.Ports.MCP)
	kept := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{}}
	if _, err := harness.HTTP(ctx, kept, http.MethodGet, health, nil, nil); err != nil {
		return err
	}
	if err := s.UserConfig("idle_suspend = \"10s\"\n"); err != nil {
		return err
	}
	defer s.UserConfig("")
	// status asks agent-mcp for its health, a connection to its port
	// that counts as use when the holder notes it (every second), and
	// list --json runs commands in the guest (its CPU): the VM is asked at
	// most every 5 s, so that the test's own questions leave it idle.
	var asked time.Time
	if err := s.Until(ctx, "the idle VM to hibernate", func() (bool, error) {
		if time.Since(asked) < 5*time.Second {
			return false, fmt.Errorf("status: %+v", st)
		}
		asked = time.Now()
		st, _, err = s.Status(ctx, ref.Branch, harness.StatusKeys())
		return err == nil && st.Suspend == "hibernated", fmt.Errorf("status: %+v, %v", st, err)
	}); err != nil {
		return err
	}
	if err := s.UserConfig(""); err != nil { // once is enough
		return err
	}
	began := time.Now() // a new connection wakes it; the kept one stays quiet
	if r, err := harness.HTTP(ctx, &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{}}, http.MethodGet, health, nil, nil); err != nil || r.Status != http.StatusOK {
		return fmt.Errorf("a request to the hibernated VM's MCP port: %+v, %v", r, err)
	}
	s.Notef("a request to agent-mcp woke the hibernated VM and was answered in %s", time.Since(began).Round(time.Millisecond))
	if r, err := harness.HTTP(ctx, kept, http.MethodGet, health, nil, nil); err != nil || !r.Reused {
		return fmt.Errorf("the HTTP connection kept through the hibernation: %+v, %v; want it reused, open throughout", r, err)
	}
	if infos, err := sessions(ctx, s, ref); err != nil || len(infos) != 1 || infos[0].Name != name || infos[0].Exited {
		return harness.Failf(s.LastResult(), "sessions after the wake: %+v, %v; want %s, running", infos, err, name)
	}
	if err := harness.Want(track(s.Call(ctx, ref.Call("suspend", "--hibernate"))), 0); err != nil {
		return err
	}
	began = time.Now()
	if _, err := s.ExecOK(ctx, ref.Branch, "true"); err != nil {
		return err
	}
	s.Notef("exec woke it in %s", time.Since(began).Round(time.Millisecond))
	_, err = s.Healthy(ctx, ref.Branch)
	return err
}

// forkAtWork forks the VM while its agent runs in a session (its working
// directory /workspace), checks the source and the fork, and destroys the
// fork, leaving the source running.
func forkAtWork(ctx context.Context, s *harness.S, ref harness.VMRef, name, wantSum string, track func(*harness.Result) *harness.Result) error {
	const branch = sessionsBranch + "-fork"
	s.Register(branch, ref.Dir)
	res := track(s.Call(ctx, harness.Call{Args: []string{"fork", "--vm", sessionsBranch, "--json", branch}, Dir: ref.Dir}))
	if err := harness.Want(res, 0); err != nil {
		return err
	}
	var out struct {
		State    string `json:"state"`
		PausedMS int64  `json:"paused_ms"`
		Forks    []struct {
			Slug string `json:"slug"`
		} `json:"forks"`
	}
	if err := json.Unmarshal([]byte(res.Stdout), &out); err != nil || out.State != "running" || out.PausedMS <= 0 || len(out.Forks) != 1 {
		return harness.Failf(res, "fork --json: %+v (%v); want the running VM paused for the copy, one fork", out, err)
	}
	s.Notef("paused %d ms", out.PausedMS)
	infos, err := sessions(ctx, s, ref)
	if err != nil {
		return err
	}
	if len(infos) != 1 || infos[0].Name != name || infos[0].Exited {
		return harness.Failf(s.LastResult(), "sessions after the fork: %+v, want %s, still running", infos, name)
	}
	st, res, err := s.Status(ctx, branch, harness.StatusKeys())
	if err != nil {
		return err
	}
	if st.State != "stopped" {
		return harness.Failf(res, "the fork is %s, want stopped", st.State)
	}
	ready, err := os.ReadFile(filepath.Join(st.Paths.Workspace, ".agent-ready"))
	if err != nil || strings.TrimSpace(string(ready)) != wantSum {
		return harness.Failf(res, "the fork's workspace lacks the agent's untracked .agent-ready (%q, %v)", ready, err)
	}
	if got, err := harness.Git(ctx, st.Paths.Workspace, "branch", "--show-current"); err != nil || strings.TrimSpace(got) != branch {
		return harness.Failf(res, "the fork's workspace is on %q (%v), want %s", got, err, branch)
	}
	if err := harness.Want(track(s.Call(ctx, harness.Call{Args: []string{"destroy", "--force", branch}, Dir: ref.Dir})), 0); err != nil {
		return err
	}
	_, err = s.Healthy(ctx, sessionsBranch)
	return err
}

// atWork is the checkpoint checkpointAtWork takes and rollbackToIt rolls
// back to.
const atWork = "at-work"

// checkpointAtWork has the guest write a file to the workspace, takes a
// checkpoint of the running VM while its agent's session runs, which
// runs on, then deletes that file and makes one in the workspace and one
// on the guest's disk.
func checkpointAtWork(ctx context.Context, s *harness.S, ref harness.VMRef, name string, track func(*harness.Result) *harness.Result) error {
	if _, err := s.ExecOK(ctx, ref.Branch, "sh", "-c", "echo kept > checkpointed.txt"); err != nil {
		return err
	}
	res := track(s.Call(ctx, harness.Call{Args: []string{"checkpoint", "--vm", ref.Branch, "--json", atWork}, Dir: ref.Dir}))
	if err := harness.Want(res, 0); err != nil {
		return err
	}
	var out struct {
		Name     string `json:"name"`
		State    string `json:"state"`
		PausedMS int64  `json:"paused_ms"`
	}
	if err := json.Unmarshal([]byte(res.Stdout), &out); err != nil || out.Name != atWork || out.State != "running" || out.PausedMS <= 0 {
		return harness.Failf(res, "checkpoint --json: %+v (%v); want %s of the running VM, paused for the copy", out, err, atWork)
	}
	s.Notef("paused %d ms", out.PausedMS)
	infos, err := sessions(ctx, s, ref)
	if err != nil {
		return err
	}
	if len(infos) != 1 || infos[0].Name != name || infos[0].Exited {
		return harness.Failf(s.LastResult(), "sessions after the checkpoint: %+v, want %s, still running", infos, name)
	}
	_, err = s.ExecOK(ctx, ref.Branch, "sh", "-c", "rm checkpointed.txt && echo new > made-after.txt && echo new > ~/made-after && sync")
	return err
}

// rollbackToIt rolls the stopped VM back to checkpointAtWork's checkpoint,
// starts it and looks: the workspace and the guest's disk are as they were
// then, and what the VM had is kept as a checkpoint of its own.
func rollbackToIt(ctx context.Context, s *harness.S, ref harness.VMRef, track func(*harness.Result) *harness.Result) error {
	res := track(s.Call(ctx, harness.Call{Args: []string{"rollback", "--vm", ref.Branch, atWork}, Dir: ref.Dir}))
	if err := harness.Want(res, 0); err != nil {
		return err
	}
	if !strings.Contains(res.Stdout, "before-rollback-") {
		return harness.Failf(res, "rollback does not name the checkpoint it kept of what the VM had")
	}
	// What the VM had shares the files unchanged since with the checkpoint.
	res, err := s.OK(ctx, "checkpoint", "list", ref.Branch, "--json")
	if err != nil {
		return err
	}
	var cs []struct {
		Name   string `json:"name"`
		Bytes  int64  `json:"bytes"`
		Shared int64  `json:"shared_bytes"`
	}
	if err := json.Unmarshal([]byte(res.Stdout), &cs); err != nil || len(cs) != 2 || cs[0].Shared <= 0 || cs[1].Shared != cs[0].Shared || cs[0].Shared >= cs[0].Bytes {
		return harness.Failf(res, "checkpoint list --json: %+v (%v); want %s and the one kept before the rollback sharing their unchanged files", cs, err, atWork)
	}
	if _, err := s.Start(ctx, ref.Branch); err != nil {
		return err
	}
	res, err = s.ExecOK(ctx, ref.Branch, "sh", "-c", `cat checkpointed.txt; for f in made-after.txt ~/made-after; do test ! -e "$f" || echo "$f is there"; done; git branch --show-current`)
	if err != nil {
		return err
	}
	if got, want := strings.Fields(res.Stdout), []string{"kept", sessionsBranch}; !slices.Equal(got, want) {
		return harness.Failf(res, "after the rollback: %q; want checkpointed.txt back (kept), neither made-after file, on %s", got, sessionsBranch)
	}
	return nil
}

// typing starts c with a keyboard for its stdin; its result arrives on done.
// runAndAnswer makes call c (a run that attaches to the stand-in agent) at
// a terminal and, once the session has an attached client, answers the
// agent's question for an exit status with status; it returns the run's
// result.
func runAndAnswer(ctx context.Context, s *harness.S, ref harness.VMRef, c harness.Call, status int) (*harness.Result, error) {
	kbd, done, err := typing(ctx, s, c)
	if err != nil {
		return nil, err
	}
	defer kbd.Close()
	if err := waitAttached(ctx, s, ref, done); err != nil {
		return nil, err
	}
	kbd.Type(strconv.Itoa(status) + "\r")
	return <-done, nil
}

func typing(ctx context.Context, s *harness.S, c harness.Call) (*harness.Keyboard, chan *harness.Result, error) {
	kbd, err := harness.NewKeyboard()
	if err != nil {
		return nil, nil, err
	}
	c.Stdin = kbd.File
	done := make(chan *harness.Result, 1)
	go func() { done <- s.Call(ctx, c) }()
	return kbd, done, nil
}

// waitAgentReady waits until the stand-in agent has written its ready file
// in the VM's workspace (on the host) and returns what it wrote; a run that
// ends first is a failure.
func waitAgentReady(ctx context.Context, s *harness.S, dir string, workspace *string, done chan *harness.Result) (string, error) {
	var ready string
	err := s.Until(ctx, "the stand-in agent's ready file", func() (bool, error) {
		select {
		case res := <-done:
			done <- res
			return false, harness.GiveUp(harness.Failf(res, "run ended before the agent was ready: %s", res.Outcome()))
		default:
		}
		if *workspace == "" {
			res := s.Call(ctx, harness.Call{Args: []string{"status", "--json", sessionsBranch}, Dir: dir, Quiet: true})
			var st struct {
				Paths struct {
					Workspace string `json:"workspace"`
				} `json:"paths"`
			}
			if res.ExitCode != 0 || json.Unmarshal([]byte(res.Stdout), &st) != nil || st.Paths.Workspace == "" {
				return false, errors.New("status --json names no workspace yet")
			}
			*workspace = st.Paths.Workspace
		}
		b, err := os.ReadFile(filepath.Join(*workspace, ".agent-ready"))
		if err != nil || !bytes.HasSuffix(b, []byte("\n")) {
			return false, errors.New("no ready file in the workspace yet")
		}
		ready = strings.TrimSpace(string(b))
		return true, nil
	})
	return ready, err
}

// waitAttached waits until the session has an attached client.
func waitAttached(ctx context.Context, s *harness.S, ref harness.VMRef, done chan *harness.Result) error {
	return s.Until(ctx, "run to attach to the session", func() (bool, error) {
		select {
		case res := <-done:
			done <- res
			return false, harness.GiveUp(harness.Failf(res, "run ended before it attached: %s", res.Outcome()))
		default:
		}
		infos, err := sessions(ctx, s, ref)
		if err != nil {
			return false, err
		}
		return len(infos) == 1 && infos[0].Attached > 0, fmt.Errorf("sessions: %+v", infos)
	})
}

func sessions(ctx context.Context, s *harness.S, ref harness.VMRef) ([]sessionInfo, error) {
	res := s.Call(ctx, ref.Call("sessions", "--json"))
	if err := harness.Want(res, 0); err != nil {
		return nil, err
	}
	var infos []sessionInfo
	if err := json.Unmarshal([]byte(res.Stdout), &infos); err != nil {
		return nil, harness.Failf(res, "sessions --json: %v", err)
	}
	return infos, nil
}

// topSteps runs `agent-vm top` in a terminal of 80x24 on this host, as a
// user would, while the stand-in agent waits: the screen shows the VM's
// branch with its agent waiting and what it asked; q quits. top --json
// says the same.
func topSteps(ctx context.Context, s *harness.S, ref harness.VMRef) error {
	t, err := s.StartTerm(ctx, 80, 24, []string{"NO_COLOR=1"}, s.Argv("top", "--every", "1s")...)
	if err != nil {
		return err
	}
	defer t.Close(ctx)
	// Keys typed before the screen is up are lost, as a user's would be.
	if err := s.Until(ctx, "top's first screen", func() (bool, error) {
		return strings.Contains(t.Screen(ctx), "agent-vm top"), errors.New("no screen yet")
	}); err != nil {
		return err
	}
	// Other scenarios' VMs may be on the screen: the filter keeps this one,
	// which is then the selected VM, whose detail shows what its agent asked.
	if err := t.Keys(ctx, "/"); err != nil {
		return err
	}
	if err := t.Keys(ctx, "-l", sessionsBranch); err != nil {
		return err
	}
	if err := t.Keys(ctx, "Enter"); err != nil {
		return err
	}
	var screen string
	err = s.Until(ctx, "top's screen", func() (bool, error) {
		screen = t.Screen(ctx)
		return strings.Contains(screen, sessionsBranch) && strings.Contains(screen, "waiting") &&
			strings.Contains(screen, "stand-in asks: an exit status?"), fmt.Errorf("the screen:\n%s", screen)
	})
	if err != nil {
		return err
	}
	s.Notef("top's screen:\n%s", strings.TrimRight(screen, "\n"))
	if err := t.Keys(ctx, "q"); err != nil {
		return err
	}
	if err := s.Until(ctx, "top to quit on q", func() (bool, error) { return !t.Running(ctx), errors.New("top still runs") }); err != nil {
		return err
	}
	// top --json and list --json say it too: the VM's agent waits, its QEMU has a PSS.
	type live struct {
		Branch string `json:"branch"`
		Agent  string `json:"agent_state"`
		PSS    int64  `json:"pss_bytes"`
	}
	var snap struct{ VMs []live }
	var listed []live
	for _, c := range []struct {
		args []string
		into any
		vms  func() []live
	}{{[]string{"top", "--json"}, &snap, func() []live { return snap.VMs }}, {[]string{"list", "--json"}, &listed, func() []live { return listed }}} {
		res := s.Call(ctx, harness.Call{Args: c.args})
		if err := harness.Want(res, 0); err != nil {
			return err
		}
		if err := json.Unmarshal([]byte(res.Stdout), c.into); err != nil {
			return harness.Failf(res, "%v: %v", c.args, err)
		}
		if !slices.ContainsFunc(c.vms(), func(v live) bool { return v.Branch == sessionsBranch && v.Agent == "waiting" && v.PSS > 0 }) {
			return harness.Failf(res, "%v has no %s with its agent waiting and a PSS", c.args, sessionsBranch)
		}
	}
	return nil
}

func humanBytes(n int64) string {
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
