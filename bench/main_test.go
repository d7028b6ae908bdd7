package main

import (
	"regexp"
	"strings"
	"testing"
)

// The side-by-side runs the package comment and docs/benchmarks.md give
// pick exactly the figures they name: an id is a prefix of another (P1 of
// P1'), and the figures run in figureSpecs' order, not -only's.
func TestSelected(t *testing.T) {
	for only, want := range map[string]string{
		"P1'|P6|P7|P9":   "P1' P6 P7 P9",
		"P9|P7|P6|P1'":   "P1' P6 P7 P9",
		"P1|P2|P3|P6|P7": "P1 P1' P2 P3 P6 P7",
		"P1'|P2|P3":      "P1' P2 P3",
		"^(P4|P5|P1)$":   "P5 P1 P4",
		"P9":             "P9",
		"P10|P11":        "P10 P11",
		"P1.":            "P1' P10 P11 P12",
		"P12":            "P12",
	} {
		var ids []string
		for _, s := range selected(regexp.MustCompile(only)) {
			ids = append(ids, s.ID)
		}
		if got := strings.Join(ids, " "); got != want {
			t.Errorf("-only %q selects %q, want %q", only, got, want)
		}
	}
	if got, all := len(selected(nil)), len(figureSpecs()); got != all {
		t.Errorf("no -only selects %d figures, want all %d", got, all)
	}
}
