package main

import (
	"math"
	"reflect"
	"strings"
	"testing"
)

func TestP7Groups(t *testing.T) {
	for env, want := range map[string][]int{"": {1, 2, 3, 1}, "3, 6": {1, 3, 6, 1}} {
		t.Setenv("BENCH_P7_GROUPS", env)
		if got, err := p7Groups(); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("BENCH_P7_GROUPS=%q: %v, %v; want %v", env, got, err, want)
		}
	}
	for _, bad := range []string{"1", "x", "3,,4", "17"} {
		t.Setenv("BENCH_P7_GROUPS", bad)
		if _, err := p7Groups(); err == nil || !strings.Contains(err.Error(), "hint:") {
			t.Errorf("BENCH_P7_GROUPS=%q: %v, want an error with a hint", bad, err)
		}
	}
}

// A group of which not all VMs became healthy is measured: its time row
// has no sample, and its healthy row says how many of how many.
func TestP7Rows(t *testing.T) {
	nan := math.NaN()
	rows := p7Rows([]int{1, 3, 6, 3, 1},
		map[int][]float64{1: {30, 32}, 3: {70, 75}, 6: {nan}},
		map[int][]float64{1: {1, 1}, 3: {3, 3}, 6: {4}})
	var ids []string
	for _, r := range rows {
		ids = append(ids, r.ID)
	}
	if got := strings.Join(ids, " "); got != "P7.3 P7.3.healthy P7.6 P7.6.healthy" {
		t.Fatalf("rows %q, want P7.3, P7.6 and their healthy rows once each", got)
	}
	if r := rows[0]; r.Subject.Summary.N != 2 || r.Reference.Summary.N != 2 || r.Ratio.N == 0 {
		t.Errorf("P7.3: %+v, want both rounds of 3 against both VMs alone", r)
	}
	if r := rows[2]; r.Subject.Summary.N != 0 || r.Ratio.N != 0 {
		t.Errorf("P7.6: %+v, want no sample (not all became healthy)", r)
	}
	r := rows[3]
	if r.Subject.Summary.Median != 4 || r.Reference.Summary.Median != 6 || r.Unit != "VMs" || !strings.Contains(r.Note, "all 6") {
		t.Errorf("P7.6.healthy: %+v (note %q), want 4 of 6 VMs and the goal", r, r.Note)
	}
}
