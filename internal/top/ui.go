package top

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/agent-vm/agent-vm/internal/agentstate"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/agent-vm/agent-vm/internal/vminfo"
)

// Options are the screen's.
type Options struct {
	Gatherer *Gatherer
	// Self is agent-vm's binary, which the keys run (attach, logs,
	// suspend, resume, net approve|deny, destroy).
	Self string
	// StateDir is passed on to them (--state-dir), "" for their default.
	StateDir string
	Run      execx.Runner  // nil: execx.OS
	Every    time.Duration // between snapshots; 0: 2 s
	NoColor  bool          // no reverse video: the selected row is marked by ">" alone
	In       *os.File
	Out      *os.File
}

// MinWidth and MinHeight are the smallest terminal the screen fits.
const (
	MinWidth  = 60
	MinHeight = 10
)

// Run shows the screen until the user quits or ctx ends.
func Run(ctx context.Context, o Options) error {
	if o.Every == 0 {
		o.Every = 2 * time.Second
	}
	if o.Run == nil {
		o.Run = execx.OS{}
	}
	if o.StateDir != "" {
		// The keys' commands run in neutralDir.
		abs, err := filepath.Abs(o.StateDir)
		if err != nil {
			return err
		}
		o.StateDir = abs
	}
	m := &model{o: o, ctx: ctx, width: 80, height: 24}
	p := tea.NewProgram(m, tea.WithContext(ctx), tea.WithInput(o.In), tea.WithOutput(o.Out))
	_, err := p.Run()
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

type model struct {
	o             Options
	ctx           context.Context
	snap          Snapshot
	err           error
	sel           int
	filter        string
	typing        bool   // the filter is being typed
	confirm       string // the VM whose destroy waits for y
	msg           string // what the last key's command said
	width, height int
	loaded        bool
}

type snapMsg struct {
	snap Snapshot
	err  error
}

type doneMsg struct{ text string }

func (m *model) gather() tea.Cmd {
	return func() tea.Msg {
		s, err := m.o.Gatherer.Gather(m.ctx)
		return snapMsg{s, err}
	}
}

func (m *model) Init() tea.Cmd { return m.gather() }

func (m *model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
	case snapMsg:
		bell := m.loaded && m.newlyWaiting(msg.snap)
		m.snap, m.err, m.loaded = msg.snap, msg.err, true
		m.clamp()
		next := tea.Tick(m.o.Every, func(time.Time) tea.Msg { return m.gather()() })
		if bell {
			return m, tea.Batch(tea.Raw("\a"), next)
		}
		return m, next
	case doneMsg:
		m.msg = msg.text
		return m, m.gather()
	case tea.KeyPressMsg:
		return m, m.key(msg.String())
	}
	return m, nil
}

// newlyWaiting says whether an agent of next waits that did not in the
// snapshot shown: the screen rings the terminal's bell.
func (m *model) newlyWaiting(next Snapshot) bool {
	was := map[string]bool{}
	for _, r := range m.snap.Rows {
		for _, s := range r.Sessions {
			was[r.VM+"/"+s.Name] = s.State == agentstate.Waiting
		}
	}
	for _, r := range next.Rows {
		for _, s := range r.Sessions {
			if s.State == agentstate.Waiting && !was[r.VM+"/"+s.Name] {
				return true
			}
		}
	}
	return false
}

// rows are the snapshot's rows the filter lets through.
func (m *model) rows() []Row {
	var out []Row
	for _, r := range m.snap.Rows {
		if m.filter == "" || strings.Contains(r.Repo, m.filter) || strings.Contains(r.Branch, m.filter) {
			out = append(out, r)
		}
	}
	return out
}

func (m *model) clamp() {
	m.sel = max(0, min(m.sel, len(m.rows())-1))
}

func (m *model) selected() (Row, bool) {
	rs := m.rows()
	if m.sel < 0 || m.sel >= len(rs) {
		return Row{}, false
	}
	return rs[m.sel], true
}

// key acts on a key: moving, filtering, or one of agent-vm's commands for
// the selected VM.
func (m *model) key(k string) tea.Cmd {
	if m.typing {
		switch k {
		case "enter":
			m.typing = false
		case "esc":
			m.typing, m.filter = false, ""
		case "backspace":
			if m.filter != "" {
				m.filter = m.filter[:len(m.filter)-1]
			}
		default:
			if len(k) == 1 {
				m.filter += k
			}
		}
		m.clamp()
		return nil
	}
	r, ok := m.selected()
	if m.confirm != "" {
		vm := m.confirm
		m.confirm = ""
		if k == "y" {
			return m.command("destroy", vm)
		}
		m.msg = "destroy cancelled"
		return nil
	}
	switch k {
	case "q", "ctrl+c":
		return tea.Quit
	case "up", "k":
		m.sel = max(0, m.sel-1)
	case "down", "j":
		m.sel = min(len(m.rows())-1, m.sel+1)
	case "/":
		m.typing, m.filter = true, ""
	case "enter", "a":
		if ok {
			return m.handOver(m.args("attach", append([]string{r.VM}, sessionOf(r)...)...)...)
		}
	case "l":
		if ok {
			return m.handOver(append([]string{"sh", "-c", `"$0" "$@" | ${PAGER:-less}`}, m.args("logs", r.VM, "-n", "300")...)...)
		}
	case "s":
		if ok {
			return m.command("suspend", r.VM)
		}
	case "r":
		if ok {
			return m.command("resume", r.VM)
		}
	case "y", "n":
		if ok && len(r.Asks) > 0 {
			verb := map[string]string{"y": "approve", "n": "deny"}[k]
			return m.command("net", verb, "--vm", r.VM, strconv.Itoa(r.Asks[0].ID))
		}
	case "d":
		if ok {
			m.confirm = r.VM
		}
	}
	return nil
}

// sessionOf names the session attach joins: the one whose agent needs the
// user most, when the VM has several.
func sessionOf(r Row) []string {
	for _, s := range r.Sessions {
		if s.State == r.Agent && len(r.Sessions) > 1 {
			return []string{"--session", s.Name}
		}
	}
	return nil
}

// neutralDir is where the keys' commands run: outside any repository, a
// VM's name (as the screen shows it) means that VM whatever its
// repository, as it does in list.
const neutralDir = "/"

// args are agent-vm's arguments for a command, with the state directory.
func (m *model) args(verb string, rest ...string) []string {
	a := []string{m.o.Self}
	if m.o.StateDir != "" {
		a = append(a, "--state-dir", m.o.StateDir)
	}
	return append(append(a, verb), rest...)
}

// command runs an agent-vm command for a key and shows the last line it
// said.
func (m *model) command(verb string, rest ...string) tea.Cmd {
	argv := m.args(verb, rest...)
	m.msg = "running: agent-vm " + strings.Join(argv[1:], " ")
	return func() tea.Msg {
		res, err := m.o.Run.Run(m.ctx, execx.Cmd{Path: argv[0], Args: argv[1:], Dir: neutralDir})
		text := strings.TrimSpace(string(res.Stdout) + "\n" + string(res.Stderr))
		if err != nil {
			text = err.Error()
		}
		lines := strings.Split(text, "\n")
		return doneMsg{termsafe.String(lines[len(lines)-1])}
	}
}

// handOver gives the terminal to a program (attach, a pager) until it
// ends. It runs through os/exec rather than execx: the program needs the
// terminal's own descriptors, which bubbletea hands it, where execx's
// runner keeps copies of the output.
func (m *model) handOver(argv ...string) tea.Cmd {
	c := exec.CommandContext(m.ctx, argv[0], argv[1:]...)
	c.Dir = neutralDir
	return tea.ExecProcess(c, func(err error) tea.Msg {
		if err != nil {
			return doneMsg{termsafe.String(err.Error())}
		}
		return doneMsg{""}
	})
}

func (m *model) View() tea.View {
	v := tea.NewView(m.render())
	v.AltScreen = true
	return v
}

// render draws the screen: a heading, a row a VM, and below them the
// selected VM's detail, the last message and the keys.
func (m *model) render() string {
	if m.width < MinWidth || m.height < MinHeight {
		return fmt.Sprintf("agent-vm top: the terminal is %dx%d; top needs at least %dx%d", m.width, m.height, MinWidth, MinHeight)
	}
	var b strings.Builder
	rows := m.rows()
	waiting := 0
	for _, r := range rows {
		if r.Agent == agentstate.Waiting || len(r.Asks) > 0 {
			waiting++
		}
	}
	head := fmt.Sprintf("agent-vm top  %d VMs, %d need you  %s", len(rows), waiting, m.snap.Taken.Local().Format("15:04:05"))
	if m.filter != "" || m.typing {
		head += "  filter: " + m.filter
		if m.typing {
			head += "_"
		}
	}
	line(&b, head, m.width)
	line(&b, "  "+columns("BRANCH", "STATE", "AGENT", "CPU%", "PSS", "NET/1m", "ASK"), m.width)
	if !m.loaded {
		line(&b, "  reading the VMs...", m.width)
	}
	if m.err != nil {
		line(&b, "  "+termsafe.String(m.err.Error()), m.width)
	}
	space := m.height - 8 // heading, columns, blank, detail (3), message, keys
	first := max(0, m.sel-space+1)
	for k := first; k < len(rows) && k < first+space; k++ {
		r := rows[k]
		mark := "  "
		if k == m.sel {
			mark = "> "
		}
		text := termsafe.Truncate(columns(termsafe.String(r.Branch), r.State, agentWord(r),
			percent(r.CPU), mib(r.PSS), fmt.Sprintf("%d/%d", r.Conns, r.Refused), count(len(r.Asks))), m.width-2)
		if k == m.sel && !m.o.NoColor {
			text = "\x1b[7m" + text + "\x1b[0m" // reverse video, not a colour
		}
		b.WriteString(mark + text + "\n")
	}
	if len(m.snap.Rows) == 0 && m.loaded {
		line(&b, "  no VMs (agent-vm run BRANCH makes one)", m.width)
	}
	b.WriteString("\n")
	if r, ok := m.selected(); ok {
		// The repository's path keeps its end; what the agent said and
		// its screen's last line get lines of their own.
		line(&b, r.VM+"  "+termsafe.TruncateStart(termsafe.String(r.Repo), max(10, m.width-termsafe.Width(r.VM)-2)), m.width)
		if d := detail(r); d != "" {
			line(&b, "  "+d, m.width)
		}
		if r.Last != "" {
			line(&b, "  | "+termsafe.String(r.Last), m.width)
		}
	}
	switch {
	case m.confirm != "":
		line(&b, fmt.Sprintf("destroy VM %s? y to destroy (it refuses while the workspace has unsaved work), any other key keeps it", m.confirm), m.width)
	case m.msg != "":
		line(&b, m.msg, m.width)
	}
	line(&b, "enter attach  l logs  s suspend  r resume  y/n ask  d destroy  / filter  q quit", m.width)
	return b.String()
}

// agentWord is the AGENT column: the most pressing state, and how many
// sessions there are when more than one.
func agentWord(r Row) string {
	w := r.Agent
	if w == "" {
		w = "-"
	}
	if n := len(r.Sessions); n > 1 {
		w += fmt.Sprintf(" (%d sessions)", n)
	}
	return w
}

// detail is what the selected VM's agent said, or its oldest ask.
func detail(r Row) string {
	switch r.Suspend {
	case vminfo.SuspendSaved:
		return "suspended: its memory saved to disk (r resumes it)"
	case vminfo.SuspendPaused:
		return "suspended: paused in place, its memory held (r resumes it)"
	case vminfo.SuspendHibernated:
		return "hibernated: its memory on disk; attach, r or a connection wakes it"
	}
	if len(r.Asks) > 0 {
		a := r.Asks[0]
		return termsafe.String(fmt.Sprintf("asks to reach %s:%d (%s), ask %d: y lets it through, n refuses it", a.Host, a.Port, a.Method, a.ID))
	}
	for _, s := range r.Sessions {
		if s.State == r.Agent && s.Message != "" {
			return termsafe.String(s.Name + ": " + s.Message)
		}
	}
	if r.Err != "" {
		return termsafe.String(r.Err)
	}
	return ""
}

func line(b *strings.Builder, s string, width int) {
	b.WriteString(termsafe.Truncate(s, width))
	b.WriteString("\n")
}

// widths are the columns' widths; the last three are right-aligned.
var widths = []int{18, 10, 22, 5, 6, 7, 3}

// columns lays out one row's cells, each cut or padded to its column in
// terminal columns (fmt pads by runes, which wide characters misalign).
func columns(cells ...string) string {
	var b strings.Builder
	for k, c := range cells {
		c = termsafe.Truncate(c, widths[k])
		pad := strings.Repeat(" ", widths[k]-termsafe.Width(c))
		if k >= 3 {
			b.WriteString(pad + c)
		} else {
			b.WriteString(c + pad)
		}
		if k < len(cells)-1 {
			b.WriteString(" ")
		}
	}
	return b.String()
}

func percent(p float64) string {
	if p < 0 {
		return "-"
	}
	return strconv.FormatFloat(p, 'f', 0, 64)
}

func mib(b int64) string {
	if b < 0 {
		return "-"
	}
	return fmt.Sprintf("%dM", b>>20)
}

func count(n int) string {
	if n == 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

// Text is the screen as it would show snap, width by height, without
// reverse video or a selection mark: `top --once`.
func Text(snap Snapshot, width, height int) string {
	m := &model{snap: snap, loaded: true, width: width, height: height, sel: -1, o: Options{NoColor: true}}
	return m.render()
}

// Print prints one snapshot, taken a second after a first one (for the
// processor use): as the screen's text, or as JSON (writeJSON).
func Print(ctx context.Context, g *Gatherer, out io.Writer, writeJSON func(io.Writer, any) error) error {
	if _, err := g.Gather(ctx); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Second):
	}
	snap, err := g.Gather(ctx)
	if err != nil {
		return err
	}
	if writeJSON != nil {
		return writeJSON(out, snap)
	}
	_, err = fmt.Fprint(out, Text(snap, 100, 10+len(snap.Rows)))
	return err
}
