// Package session is agent sessions in the guest: what `agent-vm run`,
// `attach`, `sessions` and `logs --session` ask the guest to do, as shell
// command lines for an SSH exec, and how to read the answers.
//
// An agent runs in a tmux session on agent-vm's own tmux server (socket
// "agent-vm", no user configuration), as the guest user, in the workspace.
// tmux is the session holder because it is the one tool that gives all of
// this at once, in every guest: the agent keeps its PTY and runs on when the
// SSH connection ends (the host keeps no process while detached), several
// clients can attach, the scrollback stays in the server's memory, and with
// remain-on-exit an agent that ended keeps its screen and exit status until
// the session is removed. (A systemd user unit would hold the process but
// not a terminal; a PTY holder of our own would have to be installed in
// both kinds of guest and would reimplement tmux's attach.)
//
// Secrets reach the agent only through its environment: the host writes
// them on the SSH session's stdin, the guest keeps them for the moment it
// takes to start the agent in a file of mode 0600 on a tmpfs (never on the
// guest's disk), and the agent's own wrapper reads and removes that file
// before it runs the agent. No command line (the guest's process list) and
// no tmux option ever carries a value.
package session

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/agentstate"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/guest"
)

// DetachKeys is how a user detaches from a session (tmux's default prefix).
const DetachKeys = "Ctrl-b d"

// Exit codes of the guest scripts for conditions the host explains.
const (
	exitNoTmux    = 90
	exitNoTmpfs   = 91
	exitDuplicate = 92
	exitNoProgram = 93
)

// ErrDuplicate means a session of that name exists already.
var ErrDuplicate = errors.New("a session of that name exists")

// ErrNoProgram means the agent's program is not a command where the
// session would run it (Spec.Require).
var ErrNoProgram = errors.New("the agent's program is not in the guest")

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$`)

// CheckName validates a session name: tmux rewrites '.' and ':' in names,
// and the name appears in commands the user types.
func CheckName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("session name %q is not valid (hint: use letters, digits, '-' and '_', at most 40, starting with a letter or digit)", name)
	}
	return nil
}

// NameFor is the default session name for an agent command: the program's
// base name, reduced to the session name grammar.
func NameFor(program string) string {
	base := program[strings.LastIndex(program, "/")+1:]
	var b strings.Builder
	for _, r := range base {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		default:
			b.WriteRune('-')
		}
	}
	s := strings.Trim(b.String(), "-_")
	if len(s) > 32 {
		s = s[:32]
	}
	if s == "" {
		return "agent"
	}
	return s
}

// Var is one environment variable for the agent. Its Value may be a
// secret: it travels only in the session's environment.
type Var struct {
	Name, Value string
}

// String hides the value, so a Var printed by mistake leaks nothing.
func (v Var) String() string { return v.Name + "=<hidden>" }

// GoString hides the value from %#v too.
func (v Var) GoString() string { return v.String() }

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// CheckEnvName validates an environment variable name.
func CheckEnvName(name string) error {
	if !envNameRE.MatchString(name) {
		return fmt.Errorf("%q is not an environment variable name (hint: letters, digits and '_', not starting with a digit)", name)
	}
	return nil
}

// Spec is a session to start.
type Spec struct {
	Name string
	Argv []string // the agent: program and arguments
	// Hooks are arguments put right after the program, which the session's
	// command as `sessions` shows it leaves out: the agent's hooks
	// (agentstate.ClaudeArgs).
	Hooks   []string
	Env     []Var // passed only through the agent's environment
	Width   int   // the initial window size (0: 80x24)
	Height  int
	Heading string // the status line's left part, e.g. the branch
	Dir     string // where the agent starts (default: the workspace)
	// Require has the start look for the program in Dir, on the start's
	// own PATH and else on a login shell's (where the session runs it),
	// and fail with ErrNoProgram without one, after a name in use is
	// refused: a caller that would install it then needs no session of its
	// own to ask.
	Require bool
}

// tmux is a command line for agent-vm's tmux server. -f /dev/null keeps the
// user's ~/.tmux.conf out (it is read only when the server starts).
func tmux(args ...string) string {
	return "tmux -L agent-vm -f /dev/null " + quote(args)
}

func quote(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = execx.ShellQuote(a)
	}
	return strings.Join(q, " ")
}

// commandOption holds the command the user sees in `sessions` (a tmux user
// option: the pane's own command line is the wrapper).
const commandOption = "@agent_vm_command"

// serverOptions are set on every start, before the session exists, so an
// agent that ends at once still leaves its status: keep dead panes, detach
// the clients of a session whose agent ended (so `run` and `attach` return
// with its status), a long scrollback, and a status line that says how to
// detach.
func serverOptions() []string {
	return []string{
		"start-server", ";",
		"set-option", "-g", "remain-on-exit", "on", ";",
		"set-option", "-g", "history-limit", "100000", ";",
		"set-option", "-g", "escape-time", "10", ";",
		"set-option", "-g", "default-terminal", "screen-256color", ";",
		"set-option", "-g", "status-left-length", "60", ";",
		"set-option", "-g", "status-right", "detach: " + DetachKeys + " ", ";",
		"set-hook", "-g", "pane-died", `run-shell -C "detach-client -s #{session_name}"`, ";",
	}
}

// wrapper is the pane's command, run by sh with the env file, the session's
// name and the agent's argv as arguments. It reads the agent's environment
// from the file and removes the file, runs the agent in a login shell (so
// PATH is the user's: npm's global bin, Nix profiles), then records the
// agent's exit status and time as session options and detaches the
// session's clients, so `run` and `attach` return with the status.
//
// The status is recorded here rather than read from tmux's pane_dead_status
// because tmux 3.3a (Debian 12) can miss the SIGCHLD of a pane's process
// while other clients talk to the server (measured: 1 in 30 sessions with
// `sessions` polling): the pane then never reports a status and its
// pane-died hook never fires. The wrapper outlives the agent, so it must not
// die of the Ctrl-C or Ctrl-\ meant for the agent: it traps them (a trap,
// not an ignore, so the agent gets the default dispositions back).
const wrapper = `f=$1; name=$2; shift 2
if ! . "$f"; then rm -f -- "$f"; echo "agent-vm: could not read the session's environment" >&2; exit 125; fi
rm -f -- "$f"
trap : INT QUIT
"${SHELL:-/bin/sh}" -lc 'exec "$@"' agent-vm-agent "$@"
st=$?
tmux set-option -t "$TMUX_PANE" ` + endedOption + ` "$(date +%s)" \; set-option -t "$TMUX_PANE" ` + statusOption + ` "$st" \; detach-client -s "=$name" 2>/dev/null
exit "$st"`

// statusOption and endedOption are set by the wrapper when the agent ends.
const (
	statusOption = "@agent_vm_status"
	endedOption  = "@agent_vm_ended"
)

// Start returns the command line that starts s (detached) and the bytes to
// write on its stdin: the environment, which the command keeps in a 0600
// file on a tmpfs until the wrapper has read it. Its exit status says what
// went wrong: see StartError.
func Start(s Spec) (cmd string, stdin []byte, err error) {
	if err := CheckName(s.Name); err != nil {
		return "", nil, err
	}
	if len(s.Argv) == 0 || s.Argv[0] == "" {
		return "", nil, errors.New("no agent command given")
	}
	var env strings.Builder
	for _, v := range s.Env {
		if err := CheckEnvName(v.Name); err != nil {
			return "", nil, err
		}
		if strings.ContainsRune(v.Value, 0) {
			return "", nil, fmt.Errorf("the value of %s contains a NUL byte, which no environment can hold", v.Name)
		}
		fmt.Fprintf(&env, "export %s=%s\n", v.Name, execx.ShellQuote(v.Value))
	}
	w, h := s.Width, s.Height
	if w <= 0 || h <= 0 {
		w, h = 80, 24
	}
	dir := s.Dir
	if dir == "" {
		dir = guest.Workspace
	}
	args := serverOptions()
	args = append(args,
		"new-session", "-d", "-s", s.Name, "-n", s.Name, "-x", strconv.Itoa(w), "-y", strconv.Itoa(h), "-c", dir,
		"--", "/bin/sh", "-c", wrapper, "agent-vm-session", "__ENVFILE__", s.Name)
	args = append(append(append(args, s.Argv[0]), s.Hooks...), s.Argv[1:]...)
	args = append(args, ";", "set-option", "-t", pane(s.Name), commandOption, display(s.Argv))
	if s.Heading != "" {
		args = append(args, ";", "set-option", "-t", pane(s.Name), "status-left", "["+s.Heading+" "+s.Name+"] ")
	}
	// The env file's path is only known in the guest: the placeholder is
	// replaced by "$f", outside any quotes, so the shell expands it.
	tm := strings.Replace(tmux(args...), execx.ShellQuote("__ENVFILE__"), `"$f"`, 1)
	require := ""
	if s.Require {
		// In the session's directory, on this shell's PATH (a builtin, no
		// process) or else on the login shell's, as the wrapper runs it: a
		// login shell is a third of a second under TCG, and an agent
		// installed where every shell finds it needs none.
		require = fmt.Sprintf(`cd %[2]s 2>/dev/null
command -v %[1]s >/dev/null || "${SHELL:-/bin/sh}" -lc 'cd "$1" 2>/dev/null; command -v "$0" >/dev/null' %[1]s %[2]s </dev/null || exit %[3]d
`, execx.ShellQuote(s.Argv[0]), execx.ShellQuote(dir), exitNoProgram)
	}
	script := fmt.Sprintf(`command -v tmux >/dev/null 2>&1 || exit %[1]d
d=${XDG_RUNTIME_DIR:-/run/user/$(id -u)}
[ "$(stat -f -c %%T "$d" 2>/dev/null)" = tmpfs ] || d=/dev/shm
[ "$(stat -f -c %%T "$d" 2>/dev/null)" = tmpfs ] || exit %[2]d
%[3]s has-session -t %[4]s 2>/dev/null && exit %[5]d
%[7]sf=$(mktemp "$d/agent-vm-session.XXXXXXXX") || exit 1 # mode 0600
cat > "$f" || { rm -f -- "$f"; exit 1; }
%[6]s || { rm -f -- "$f"; exit 1; }`,
		exitNoTmux, exitNoTmpfs, tmux(), execx.ShellQuote("="+s.Name), exitDuplicate, tm, require)
	return script, []byte(env.String()), nil
}

// display is the command as the user would type it, on one line.
func display(argv []string) string {
	return strings.NewReplacer("\n", `\n`, "\r", `\r`, "\t", " ").Replace(quote(argv))
}

// StartError explains a start script's exit status (0 is no error).
func StartError(code int, stderr string) error {
	switch code {
	case 0:
		return nil
	case exitNoTmux:
		return errors.New("tmux is not installed in the guest, and agent sessions need it (hint: `agent-vm exec BRANCH -- sudo apt-get install -y tmux` on a Debian guest; images built by this agent-vm have it)")
	case exitNoTmpfs:
		return errors.New("the guest has no tmpfs (its XDG_RUNTIME_DIR or /dev/shm) to pass the agent's environment through, and agent-vm will not write secrets to the guest's disk")
	case exitDuplicate:
		return ErrDuplicate
	case exitNoProgram:
		return ErrNoProgram
	}
	stderr = strings.TrimSpace(stderr)
	if stderr == "" {
		stderr = "no message"
	}
	return fmt.Errorf("starting the session in the guest failed (exit status %d): %s", code, stderr)
}

// Attach is the command line that attaches the terminal to a session.
func Attach(name string) string { return tmux("attach-session", "-t", "="+name) }

// Remove is the command line that ends a session (its agent, if still
// running, gets SIGHUP).
func Remove(name string) string { return tmux("kill-session", "-t", "="+name) }

// Scrollback is the command line that prints a session's whole history and
// screen, wrapped lines joined.
func Scrollback(name string) string {
	return tmux("capture-pane", "-p", "-J", "-S", "-", "-E", "-", "-t", pane(name))
}

// Screen is the command line that prints what the session's screen shows
// now, joined lines whole (top shows its last line: LastLine).
func Screen(name string) string {
	return tmux("capture-pane", "-p", "-J", "-t", pane(name))
}

// LastLine is the last line of a screen that is not blank.
func LastLine(screen string) string {
	lines := strings.Split(strings.TrimRight(screen, " \n\t"), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// pane targets a session's (only) pane, for the commands whose target is a
// pane; "=" asks for exactly that name, not a prefix.
func pane(name string) string { return "=" + name + ":" }

// Info is one session as `sessions` shows it.
type Info struct {
	Name     string    `json:"name"`
	Command  string    `json:"command"`
	Started  time.Time `json:"started"`
	Attached int       `json:"attached"` // clients attached now
	Exited   bool      `json:"exited"`
	// Status is the agent's exit status once it exited (-1: killed by a
	// signal, or unknown).
	Status  int        `json:"status"`
	EndedAt *time.Time `json:"ended_at,omitempty"`
	// State is what the agent is doing (agentstate's Working, Waiting or
	// Done, or Exited) and StateFrom how that is known: "hooks" (the
	// agent's own, StateAt when it last said so, Message what it said
	// with it), or "output" for an agent without hooks (Waiting once it
	// has printed nothing for QuietAfter).
	State     string     `json:"state"`
	StateFrom string     `json:"state_from"`
	StateAt   *time.Time `json:"state_at,omitempty"`
	Message   string     `json:"message,omitempty"`
	// Activity is when the session last printed output.
	Activity time.Time `json:"activity"`
}

// Exited is the State of a session whose agent ended.
const Exited = "exited"

// QuietAfter is how long an agent without hooks prints nothing before it
// is taken to wait for the user.
const QuietAfter = 30 * time.Second

const listFormat = "#{session_name}\t#{session_created}\t#{session_attached}\t#{pane_dead}\t#{pane_dead_status}\t#{pane_dead_time}\t#{" +
	statusOption + "}\t#{" + endedOption + "}\t#{window_activity}\t#{" + agentstate.StateOption + "}\t#{" + agentstate.AtOption + "}\t#{" +
	agentstate.MessageOption + "}\t#{" + commandOption + "}"

// List is the command line that lists the sessions (no output, exit 0,
// when there are none or tmux is not installed). A server whose last
// session was just removed exits as it is asked: that is none, too.
func List() string {
	return fmt.Sprintf(`command -v tmux >/dev/null 2>&1 || exit 0
out=$(%s 2>&1) || case $out in
  *"no server running"*|*"error connecting"*|*"No such file"*|*"server exited unexpectedly"*) exit 0 ;;
  *) printf '%%s\n' "$out" >&2; exit 1 ;;
esac
printf '%%s\n' "$out"`, tmux("list-sessions", "-F", listFormat))
}

// Parse reads List's output, as it was at now. Sessions of agent-vm's
// server that agent-vm did not start (no command option) are listed too,
// with an empty command.
func Parse(out string, now time.Time) ([]Info, error) {
	var infos []Info
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if line == "" {
			continue
		}
		f := strings.SplitN(line, "\t", 13)
		if len(f) != 13 {
			return nil, fmt.Errorf("unexpected line from tmux list-sessions: %q", line)
		}
		created, err1 := strconv.ParseInt(f[1], 10, 64)
		attached, err2 := strconv.Atoi(f[2])
		activity, err3 := strconv.ParseInt(f[8], 10, 64)
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("unexpected line from tmux list-sessions: %q: %w", line, err)
		}
		in := Info{Name: f[0], Command: f[12], Started: time.Unix(created, 0).UTC(), Attached: attached, Status: -1,
			Activity: time.Unix(activity, 0).UTC()}
		status, ended := f[6], f[7]
		if status == "" && f[3] == "1" && f[5] != "" {
			// No status from the wrapper, but tmux reaped the pane's
			// process: the wrapper itself was killed (or the session
			// was not made by agent-vm).
			status, ended = f[4], f[5]
		}
		if t, err := strconv.ParseInt(ended, 10, 64); err == nil && t > 0 {
			end := time.Unix(t, 0).UTC()
			in.Exited, in.EndedAt = true, &end
			if st, err := strconv.Atoi(status); err == nil {
				in.Status = st
			}
		}
		in.agentState(f[9], f[10], f[11], now)
		infos = append(infos, in)
	}
	return infos, nil
}

// agentState sets the session's State from what the agent's hooks kept
// (state, at, message: agentstate.Record's options), else from its output.
func (in *Info) agentState(state, at, message string, now time.Time) {
	switch {
	case in.Exited:
		in.State, in.StateFrom = Exited, "tmux"
	case state == agentstate.Working || state == agentstate.Waiting || state == agentstate.Done:
		in.State, in.StateFrom, in.Message = state, "hooks", message
		if t, err := strconv.ParseInt(at, 10, 64); err == nil && t > 0 {
			when := time.Unix(t, 0).UTC()
			in.StateAt = &when
		}
	case now.Sub(in.Activity) >= QuietAfter:
		in.State, in.StateFrom = agentstate.Waiting, "output"
	default:
		in.State, in.StateFrom = agentstate.Working, "output"
	}
}

// Running says whether the session's agent runs and who is attached, or
// how it ended, in a word or two ("running, detached", "exited 1").
func (in Info) Running() string {
	switch {
	case in.Exited && in.Status >= 0:
		return "exited " + strconv.Itoa(in.Status)
	case in.Exited:
		return "killed"
	case in.Attached == 1:
		return "running, attached"
	case in.Attached > 1:
		return fmt.Sprintf("running, %d attached", in.Attached)
	}
	return "running, detached"
}

// Doing says what the agent is doing, at now: its state and what it said
// with it, or how long an agent without hooks has been quiet ("-" once it
// ended). The message is the guest's: escape it to print it.
func (in Info) Doing(now time.Time) string {
	switch {
	case in.State == Exited:
		return "-"
	case in.StateFrom == "output" && in.State == agentstate.Waiting:
		return fmt.Sprintf("quiet for %s", now.Sub(in.Activity).Round(time.Second))
	case in.Message != "":
		return in.State + ": " + in.Message
	}
	return in.State
}

// Find picks the session called name from infos.
func Find(infos []Info, name string) (Info, bool) {
	for _, in := range infos {
		if in.Name == name {
			return in, true
		}
	}
	return Info{}, false
}
