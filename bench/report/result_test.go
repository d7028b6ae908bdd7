package report

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func sampleResult() *Result {
	nan := math.NaN()
	return &Result{
		Schema: SchemaVersion, Date: time.Date(2026, 11, 22, 3, 4, 5, 0, time.UTC),
		Commit: "abc1234def", CommitShort: "abc1234", Command: "go run ./bench -only P3",
		Settings: Settings{N: 3, Rounds: 1, Records: 100},
		Machine:  Machine{CPUModel: "Test CPU", Cores: 2, MemoryMiB: 24000, Accel: "tcg", AccelWhy: "no KVM", OtherVMs: []string{"agent-vm-x"}},
		Figures: []*Figure{
			{ID: "P3", Title: "exec round trip", Rows: []*Row{
				NewRow("P3.exec", "exec -- true", "ms", NewSeries("agent-vm exec", []float64{200, nan, 220}), Ref("ssh true", []float64{100, 110, 110}), true),
				NewRow("P3.alone", "no reference", "ms", NewSeries("x", []float64{5}), nil, false),
			}, Notes: []string{"a note"}},
			{ID: "P7", Title: "together", Skipped: "-no-boot"},
			{ID: "P8", Title: "overlay", Errors: []string{"qemu-img failed\nsecond line"}},
		},
	}
}

func TestResultFilesShape(t *testing.T) {
	dir := t.TempDir()
	r := sampleResult()
	jsonPath, mdPath, err := r.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := filepath.Base(jsonPath), "2026-11-22-abc1234.json"; got != want {
		t.Errorf("json file %q, want %q", got, want)
	}
	if got, want := filepath.Base(mdPath), "2026-11-22-abc1234.md"; got != want {
		t.Errorf("markdown file %q, want %q", got, want)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("results dir holds %d files, want the two results (no temp files left)", len(entries))
	}

	// The JSON's documented keys, read without the harness's types.
	data, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatalf("results are not JSON: %v", err)
	}
	for _, k := range []string{"schema", "date", "commit", "commit_short", "dirty", "command", "settings", "machine", "seconds", "figures"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("results lack %q", k)
		}
	}
	machine := raw["machine"].(map[string]any)
	for _, k := range []string{"cores", "memory_mib", "cpu_model", "accel", "kernel", "qemu", "image", "load_avg_1m_start", "other_vms_at_start"} {
		if _, ok := machine[k]; !ok {
			t.Errorf("machine lacks %q", k)
		}
	}
	row := raw["figures"].([]any)[0].(map[string]any)["rows"].([]any)[0].(map[string]any)
	for _, k := range []string{"id", "what", "unit", "subject", "reference", "paired", "ratio", "difference"} {
		if _, ok := row[k]; !ok {
			t.Errorf("row lacks %q", k)
		}
	}
	samples := row["subject"].(map[string]any)["samples"].([]any)
	if len(samples) != 3 || samples[1] != nil {
		t.Errorf("subject samples %v: want 3, the failed one as null", samples)
	}
	ratio := row["ratio"].(map[string]any)
	if ratio["n"] != 2.0 || ratio["median"] != 2.0 || ratio["max"] != 2.0 {
		t.Errorf("ratio %v: want 2 pairs, both 2.0x", ratio)
	}

	// It reads back as it was written, failed samples included.
	back, err := Read(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	got := back.Figures[0].Rows[0].Subject.Samples
	if len(got) != 3 || got[0] != 200 || !math.IsNaN(got[1]) || got[2] != 220 {
		t.Errorf("samples read back as %v, want [200 NaN 220]", got)
	}
	if back.Figures[1].Skipped != "-no-boot" || back.Figures[2].Errors[0] != "qemu-img failed\nsecond line" {
		t.Errorf("skips and errors did not survive: %+v %+v", back.Figures[1], back.Figures[2])
	}
}

func TestMarkdownShape(t *testing.T) {
	var b strings.Builder
	WriteMarkdown(&b, sampleResult())
	md := b.String()
	for _, want := range []string{
		"# agent-vm benchmarks, 2026-11-22 03:04 UTC, commit abc1234\n",
		"How to read this:",
		"| CPU | Test CPU, 2 cores |",
		"| accelerator | tcg (no KVM) |",
		"| other VMs at start | agent-vm-x |",
		"| row | measure | agent-vm | reference | ratio | difference | N |",
		"| P3.exec | exec -- true | 210 ms [200-220] | ssh true: 110 ms [100-110] | **2.00x** | +105 ms [+100, +110] | 2 |",
		"| P3.alone | no reference | 5.00 ms | none | n/a |  | 1 |",
		"Not measured: -no-boot",
		"- **error:** qemu-img failed second line",
		"- a note",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	// Every row is one table line with seven cells.
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "| P") && strings.Count(line, " | ")+1 != 7 {
			t.Errorf("table line with %d cells, want 7: %s", strings.Count(line, " | ")+1, line)
		}
	}
}

func TestDirtyTreeIsInTheName(t *testing.T) {
	r := sampleResult()
	r.Dirty = true
	if got := r.baseName(); got != "2026-11-22-abc1234-dirty" {
		t.Errorf("baseName = %q, want the -dirty suffix", got)
	}
}

func TestReadResultRefusesNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.json")
	if err := os.WriteFile(path, []byte(`{"schema": 99}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Errorf("readResult of schema 99: %v, want a refusal naming the newer schema", err)
	}
}

func TestFmtNumber(t *testing.T) {
	for _, tt := range []struct {
		in   float64
		want string
	}{{1234.5, "1234"}, {12.345, "12.3"}, {1.2345, "1.23"}, {0, "0.00"}, {0.012345, "0.0123"}, {-2.5, "-2.50"}} {
		if got := fmtNumber(tt.in); got != tt.want {
			t.Errorf("fmtNumber(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
