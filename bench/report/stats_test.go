package report

import (
	"math"
	"testing"
)

func TestSummarize(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name    string
		samples []float64
		want    Summary
	}{
		{"empty", nil, Summary{}},
		{"one", []float64{7}, Summary{N: 1, Median: 7, Min: 7, Max: 7, Q1: 7, Q3: 7}},
		{"odd, unsorted", []float64{5, 1, 3}, Summary{N: 3, Median: 3, Min: 1, Max: 5, Q1: 2, Q3: 4}},
		{"even: mean of the middle two", []float64{4, 1, 3, 2}, Summary{N: 4, Median: 2.5, Min: 1, Max: 4, Q1: 1.75, Q3: 3.25}},
		{"failed samples left out", []float64{nan, 10, nan, 20}, Summary{N: 2, Median: 15, Min: 10, Max: 20, Q1: 12.5, Q3: 17.5}},
		{"only failed", []float64{nan, nan}, Summary{}},
		{"outlier moves max, not median", []float64{1, 1, 1, 1, 100}, Summary{N: 5, Median: 1, Min: 1, Max: 100, Q1: 1, Q3: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := summarize(tt.samples); got != tt.want {
				t.Errorf("summarize(%v) = %+v, want %+v", tt.samples, got, tt.want)
			}
		})
	}
}

func TestSummarizeDoesNotReorderSamples(t *testing.T) {
	s := []float64{3, 1, 2}
	summarize(s)
	if s[0] != 3 || s[1] != 1 || s[2] != 2 {
		t.Errorf("summarize sorted its input in place: %v (the raw samples keep their order in the results)", s)
	}
}

func TestMedianOfNothingIsNaN(t *testing.T) {
	if m := median(nil); !math.IsNaN(m) {
		t.Errorf("median(nil) = %v, want NaN", m)
	}
}

func TestCompare(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name                string
		subject, reference  []float64
		paired              bool
		wantRatio, wantDiff Summary
	}{
		{
			name:    "paired: one ratio per pair",
			subject: []float64{2, 4, 6}, reference: []float64{1, 2, 2}, paired: true,
			wantRatio: Summary{N: 3, Median: 2, Min: 2, Max: 3, Q1: 2, Q3: 2.5},
			wantDiff:  Summary{N: 3, Median: 2, Min: 1, Max: 4, Q1: 1.5, Q3: 3},
		},
		{
			name:    "paired: a pair with a failed side is left out",
			subject: []float64{2, nan, 9}, reference: []float64{1, 5, 3}, paired: true,
			wantRatio: Summary{N: 2, Median: 2.5, Min: 2, Max: 3, Q1: 2.25, Q3: 2.75},
			wantDiff:  Summary{N: 2, Median: 3.5, Min: 1, Max: 6, Q1: 2.25, Q3: 4.75},
		},
		{
			name:    "paired: a zero reference has no ratio but a difference",
			subject: []float64{1, 4}, reference: []float64{0, 2}, paired: true,
			wantRatio: Summary{N: 1, Median: 2, Min: 2, Max: 2, Q1: 2, Q3: 2},
			wantDiff:  Summary{N: 2, Median: 1.5, Min: 1, Max: 2, Q1: 1.25, Q3: 1.75},
		},
		{
			name:    "unpaired: ratio of the medians",
			subject: []float64{10, 30, 20}, reference: []float64{4, 6}, paired: false,
			wantRatio: Summary{N: 1, Median: 4, Min: 4, Max: 4, Q1: 4, Q3: 4},
			wantDiff:  Summary{N: 1, Median: 15, Min: 15, Max: 15, Q1: 15, Q3: 15},
		},
		{
			name:    "paired but of different lengths: ratio of the medians",
			subject: []float64{10, 30}, reference: []float64{5}, paired: true,
			wantRatio: Summary{N: 1, Median: 4, Min: 4, Max: 4, Q1: 4, Q3: 4},
			wantDiff:  Summary{N: 1, Median: 15, Min: 15, Max: 15, Q1: 15, Q3: 15},
		},
		{
			name:    "no reference samples: nothing",
			subject: []float64{1}, reference: nil, paired: false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, d := compare(tt.subject, tt.reference, tt.paired)
			if r != tt.wantRatio {
				t.Errorf("ratio = %+v, want %+v", r, tt.wantRatio)
			}
			if d != tt.wantDiff {
				t.Errorf("difference = %+v, want %+v", d, tt.wantDiff)
			}
		})
	}
}

func TestNewRowRoundsAndSummarizes(t *testing.T) {
	r := NewRow("X.1", "something", "s", NewSeries("a", []float64{1.23456789, 2.0}), Ref("b", []float64{1, 1}), true)
	if r.Subject.Samples[0] != 1.2346 {
		t.Errorf("sample kept as %v, want 1.2346 (four decimals)", r.Subject.Samples[0])
	}
	if r.Ratio.N != 2 || r.Ratio.Max != 2 || r.Reference.Summary.Median != 1 {
		t.Errorf("row summaries = ratio %+v, reference %+v", r.Ratio, r.Reference.Summary)
	}
	if none := NewRow("X.2", "no reference", "ms", NewSeries("a", []float64{5}), nil, false); none.Ratio.N != 0 || none.Reference != nil {
		t.Errorf("a row without reference got a ratio: %+v", none)
	}
}
