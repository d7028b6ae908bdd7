// Package report is what a bench run produces: the results (Result, its
// figures and rows, each a subject against its reference), their
// statistics, the JSON file and the markdown report written from them.
package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
)

// SchemaVersion is the version of the results file's shape; readers refuse
// a newer one.
const SchemaVersion = 1

// Result is one run of the harness: what was measured, where and when.
type Result struct {
	Schema      int       `json:"schema"`
	Date        time.Time `json:"date"`
	Commit      string    `json:"commit"`
	CommitShort string    `json:"commit_short"`
	// Dirty says the working tree had uncommitted changes: the figures
	// belong to the commit plus those changes.
	Dirty    bool     `json:"dirty"`
	Command  string   `json:"command"`
	Settings Settings `json:"settings"`
	Machine  Machine  `json:"machine"`
	// Seconds is how long the whole run took.
	Seconds float64   `json:"seconds"`
	Figures []*Figure `json:"figures"`
}

// Settings are the knobs the run used.
type Settings struct {
	N       int    `json:"n"`
	Rounds  int    `json:"rounds"`
	Records int    `json:"records"`
	Only    string `json:"only,omitempty"`
	NoBoot  bool   `json:"no_boot,omitempty"`
	Tree    string `json:"tree,omitempty"`
	// TreeFiles is how many files the source tree of P6 has.
	TreeFiles int `json:"tree_files,omitempty"`
}

// Machine is the host the figures come from.
type Machine struct {
	Hostname  string  `json:"hostname"`
	OS        string  `json:"os"`
	Kernel    string  `json:"kernel"`
	CPUModel  string  `json:"cpu_model"`
	Cores     int     `json:"cores"`
	MemoryMiB int     `json:"memory_mib"`
	QEMU      string  `json:"qemu"`
	Accel     string  `json:"accel"`
	AccelWhy  string  `json:"accel_reason,omitempty"`
	Image     Image   `json:"image"`
	Go        string  `json:"go"`
	LoadStart float64 `json:"load_avg_1m_start"`
	LoadEnd   float64 `json:"load_avg_1m_end"`
	// OtherVMs are QEMU processes that were not ours when the run began
	// (their -name): they compete for the same cores.
	OtherVMs []string `json:"other_vms_at_start"`
}

// Image is the base image VMs boot from, from `agent-vm image list --json`.
type Image struct {
	Name          string `json:"name"`
	Disk          string `json:"disk"`
	SizeBytes     int64  `json:"size_bytes"`
	KernelVersion string `json:"kernel_version"`
	Created       string `json:"created"`
}

// Figure is one of the figures (P1, P3 ...): rows of measurements,
// or why it was not measured.
type Figure struct {
	ID      string   `json:"id"`
	Title   string   `json:"title"`
	Rows    []*Row   `json:"rows"`
	Skipped string   `json:"skipped,omitempty"`
	Errors  []string `json:"errors,omitempty"`
	Notes   []string `json:"notes,omitempty"`
	Seconds float64  `json:"seconds"`
	// The machine's load while the figure ran: the 1-minute load average
	// at its start and end, and QEMUs not the harness's at its start.
	LoadStart float64  `json:"load_avg_1m_start"`
	LoadEnd   float64  `json:"load_avg_1m_end"`
	OtherVMs  []string `json:"other_vms_at_start"`
}

// Row is one measurement against its reference.
type Row struct {
	ID   string `json:"id"`
	What string `json:"what"`
	Unit string `json:"unit"`
	// Subject is what agent-vm does; Reference what it is compared with,
	// measured side by side in the same run.
	Subject   Series  `json:"subject"`
	Reference *Series `json:"reference,omitempty"`
	// Paired: sample i of subject and reference were taken one right after
	// the other, so Ratio and Diff are per pair.
	Paired bool `json:"paired"`
	// Ratio is subject / reference; Diff is subject - reference, in Unit.
	Ratio Summary `json:"ratio"`
	Diff  Summary `json:"difference"`
	Note  string  `json:"note,omitempty"`
}

// Series is one side of a row: its samples, raw, and their summary.
type Series struct {
	Label   string    `json:"label"`
	Samples []float64 `json:"samples"`
	Summary Summary   `json:"summary"`
}

// newRow builds a row with its summaries. A nil reference makes a row with
// no ratio (a figure the run has nothing to compare with).
func NewRow(id, what, unit string, subject Series, reference *Series, paired bool) *Row {
	r := &Row{ID: id, What: what, Unit: unit, Subject: subject, Reference: reference, Paired: paired}
	r.Subject.Summary = summarize(subject.Samples).rounded()
	if reference != nil {
		r.Reference.Summary = summarize(reference.Samples).rounded()
		r.Ratio, r.Diff = compare(subject.Samples, reference.Samples, paired)
		r.Ratio, r.Diff = r.Ratio.rounded(), r.Diff.rounded()
	}
	return r
}

// rounded keeps four decimals, as the samples have.
func (s Summary) rounded() Summary {
	r := func(v float64) float64 { return math.Round(v*1e4) / 1e4 }
	s.Median, s.Min, s.Max, s.Q1, s.Q3 = r(s.Median), r(s.Min), r(s.Max), r(s.Q1), r(s.Q3)
	return s
}

// series is a labelled set of samples, rounded to four decimals (0.1 ms
// for seconds): the rest is noise.
func NewSeries(label string, samples []float64) Series {
	rounded := make([]float64, len(samples))
	for i, v := range samples {
		rounded[i] = math.Round(v*1e4) / 1e4
	}
	return Series{Label: label, Samples: rounded}
}

// ref is a labelled reference.
func Ref(label string, samples []float64) *Series {
	s := NewSeries(label, samples)
	return &s
}

// MarshalJSON writes failed samples (NaN, which JSON cannot hold) as null.
func (s Series) MarshalJSON() ([]byte, error) {
	samples := make([]*float64, len(s.Samples))
	for i := range s.Samples {
		if !math.IsNaN(s.Samples[i]) {
			samples[i] = &s.Samples[i]
		}
	}
	type plain struct {
		Label   string     `json:"label"`
		Samples []*float64 `json:"samples"`
		Summary Summary    `json:"summary"`
	}
	return json.Marshal(plain{s.Label, samples, s.Summary})
}

// UnmarshalJSON reads null samples back as NaN.
func (s *Series) UnmarshalJSON(data []byte) error {
	var plain struct {
		Label   string     `json:"label"`
		Samples []*float64 `json:"samples"`
		Summary Summary    `json:"summary"`
	}
	if err := json.Unmarshal(data, &plain); err != nil {
		return err
	}
	s.Label, s.Summary, s.Samples = plain.Label, plain.Summary, make([]float64, len(plain.Samples))
	for i, p := range plain.Samples {
		s.Samples[i] = math.NaN()
		if p != nil {
			s.Samples[i] = *p
		}
	}
	return nil
}

// baseName is the results files' name without extension:
// <date>-<short commit>, with "-dirty" for an uncommitted tree.
func (r *Result) baseName() string {
	name := r.Date.UTC().Format("2006-01-02") + "-" + r.CommitShort
	if r.Dirty {
		name += "-dirty"
	}
	return name
}

// write stores the result as JSON and markdown in dir and returns the two
// paths. Each file is written to a temporary name and renamed, so a
// reader never sees half a file.
func (r *Result) Write(dir string) (jsonPath, mdPath string, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("creating the results directory: %w", err)
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", "", fmt.Errorf("encoding the results: %w", err)
	}
	var md bytes.Buffer
	WriteMarkdown(&md, r)
	jsonPath = filepath.Join(dir, r.baseName()+".json")
	mdPath = filepath.Join(dir, r.baseName()+".md")
	if err := atomicfile.Write(jsonPath, append(data, '\n'), 0o644); err != nil {
		return "", "", err
	}
	if err := atomicfile.Write(mdPath, md.Bytes(), 0o644); err != nil {
		return "", "", err
	}
	return jsonPath, mdPath, nil
}

// readResult reads a results file, refusing a newer schema.
func Read(path string) (*Result, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Result
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if r.Schema > SchemaVersion {
		return nil, fmt.Errorf("%s has results schema %d, newer than this harness reads (%d) (hint: update the checkout)", path, r.Schema, SchemaVersion)
	}
	return &r, nil
}
