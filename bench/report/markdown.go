package report

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// howToRead opens every results table: what the columns mean and why the
// ratios, not the absolute times, are the figures to compare.
const howToRead = `How to read this: every row compares what agent-vm does (the "agent-vm"
column) with a reference measured side by side in the same run (the
"reference" column), alternating the two (A/B/A/B) wherever the measurement
allows. The machine is shared and, without KVM, every guest instruction is
emulated, so absolute times drift from run to run by tens of percent; the
**ratio** (agent-vm / reference, per pair when paired) is the figure to
compare between runs and commits. A ratio of 1.00 means agent-vm costs
nothing over the reference; 1.30 means 30% more time (or bytes). Cells show
the median and, in brackets, the minimum and maximum of N samples (N is the
number of pairs for paired rows); the JSON file next to this one has every
raw sample and the quartiles. "difference" is agent-vm minus the reference,
in the row's unit. Load on the machine during the run is recorded under
"machine": other VMs running at the start, and the load average.`

// WriteMarkdown renders a result as a markdown report.
func WriteMarkdown(w io.Writer, r *Result) {
	fmt.Fprintf(w, "# agent-vm benchmarks, %s, commit %s", r.Date.UTC().Format("2006-01-02 15:04 UTC"), r.CommitShort)
	if r.Dirty {
		fmt.Fprint(w, " (with uncommitted changes)")
	}
	fmt.Fprint(w, "\n\n")
	fmt.Fprintf(w, "Command: `%s` (%s in all). Settings: N=%d for fast figures, %d rounds for boots and I/O, %d records for P5.\n\n",
		r.Command, fmtDuration(r.Seconds), r.Settings.N, r.Settings.Rounds, r.Settings.Records)
	writeMachine(w, r.Machine)
	fmt.Fprintf(w, "%s\n\n", howToRead)
	fmt.Fprint(w, "| row | measure | agent-vm | reference | ratio | difference | N |\n")
	fmt.Fprint(w, "|---|---|---|---|---|---|---|\n")
	for _, f := range r.Figures {
		for _, row := range f.Rows {
			writeRow(w, row)
		}
	}
	fmt.Fprintln(w)
	for _, f := range r.Figures {
		writeFigureNotes(w, f)
	}
}

func writeMachine(w io.Writer, m Machine) {
	fmt.Fprint(w, "| machine | |\n|---|---|\n")
	fmt.Fprintf(w, "| CPU | %s, %d cores |\n", mdCell(m.CPUModel), m.Cores)
	fmt.Fprintf(w, "| memory | %d MiB |\n", m.MemoryMiB)
	fmt.Fprintf(w, "| OS, kernel | %s, %s |\n", mdCell(m.OS), mdCell(m.Kernel))
	accel := m.Accel
	if m.AccelWhy != "" {
		accel += " (" + m.AccelWhy + ")"
	}
	fmt.Fprintf(w, "| accelerator | %s |\n", mdCell(accel))
	fmt.Fprintf(w, "| QEMU | %s |\n", mdCell(m.QEMU))
	fmt.Fprintf(w, "| base image | %s, kernel %s, %s |\n", mdCell(m.Image.Name), mdCell(m.Image.KernelVersion), fmtBytes(float64(m.Image.SizeBytes)))
	fmt.Fprintf(w, "| Go | %s |\n", m.Go)
	others := "none"
	if len(m.OtherVMs) > 0 {
		others = strings.Join(m.OtherVMs, ", ")
	}
	fmt.Fprintf(w, "| other VMs at start | %s |\n", mdCell(others))
	fmt.Fprintf(w, "| load average (1 min) | %.2f at start, %.2f at end |\n\n", m.LoadStart, m.LoadEnd)
}

func writeRow(w io.Writer, row *Row) {
	refCell, ratioCell, diffCell := "none", "n/a", ""
	if row.Reference != nil {
		refCell = mdCell(row.Reference.Label) + ": " + fmtSummary(row.Reference.Summary, row.Unit)
		if row.Ratio.N > 0 {
			ratioCell = "**" + fmtRange(row.Ratio, "x") + "**"
			diffCell = fmtSignedRange(row.Diff, row.Unit)
		}
	}
	n := fmt.Sprint(row.Subject.Summary.N)
	if row.Reference != nil && !row.Paired {
		n = fmt.Sprintf("%d / %d", row.Subject.Summary.N, row.Reference.Summary.N)
	}
	what := mdCell(row.What)
	if row.Note != "" {
		what += " (" + mdCell(row.Note) + ")"
	}
	fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n",
		row.ID, what, fmtSummary(row.Subject.Summary, row.Unit), refCell, ratioCell, diffCell, n)
}

func writeFigureNotes(w io.Writer, f *Figure) {
	fmt.Fprintf(w, "### %s: %s\n\n", f.ID, f.Title)
	if f.Skipped != "" {
		fmt.Fprintf(w, "Not measured: %s\n\n", f.Skipped)
		return
	}
	others := "none"
	if len(f.OtherVMs) > 0 {
		others = strings.Join(f.OtherVMs, ", ")
	}
	fmt.Fprintf(w, "%s; load average %.2f at its start, %.2f at its end; other VMs running at its start: %s.\n\n",
		fmtDuration(f.Seconds), f.LoadStart, f.LoadEnd, mdCell(others))
	for _, n := range f.Notes {
		fmt.Fprintf(w, "- %s\n", n)
	}
	for _, e := range f.Errors {
		fmt.Fprintf(w, "- **error:** %s\n", strings.ReplaceAll(e, "\n", " "))
	}
	if len(f.Notes)+len(f.Errors) > 0 {
		fmt.Fprintln(w)
	}
}

// fmtSummary is "median unit [min-max]", or "failed" without samples.
func fmtSummary(s Summary, unit string) string {
	if s.N == 0 {
		return "failed"
	}
	if s.N == 1 || s.Min == s.Max {
		return fmtValue(s.Median, unit)
	}
	return fmt.Sprintf("%s [%s-%s]", fmtValue(s.Median, unit), fmtNumber(s.Min), fmtNumber(s.Max))
}

// fmtRange is a ratio: "1.23x [1.10-1.40]", "0.0319x".
func fmtRange(s Summary, suffix string) string {
	if s.N == 1 || s.Min == s.Max {
		return fmtNumber(s.Median) + suffix
	}
	return fmt.Sprintf("%s%s [%s-%s]", fmtNumber(s.Median), suffix, fmtNumber(s.Min), fmtNumber(s.Max))
}

// fmtSignedRange is a difference with its sign: "+4.1 s [+3.0-+5.2]".
func fmtSignedRange(s Summary, unit string) string {
	if s.N == 0 {
		return ""
	}
	signed := func(v float64) string {
		if v >= 0 {
			return "+" + fmtNumber(v)
		}
		return fmtNumber(v)
	}
	out := signed(s.Median) + " " + unit
	if s.N > 1 && s.Min != s.Max {
		out += fmt.Sprintf(" [%s, %s]", signed(s.Min), signed(s.Max))
	}
	return out
}

func fmtValue(v float64, unit string) string {
	return fmtNumber(v) + " " + unit
}

// fmtNumber keeps three significant digits or so: 123, 12.3, 1.23, 0.123.
func fmtNumber(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1 || a == 0:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

func fmtBytes(b float64) string {
	return fmtNumber(b/(1<<20)) + " MiB"
}

func fmtDuration(sec float64) string {
	if sec < 60 {
		return fmt.Sprintf("%.0f s", sec)
	}
	return fmt.Sprintf("%d min %02d s", int(sec)/60, int(sec)%60)
}

// mdCell makes text safe inside a table cell.
func mdCell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}
