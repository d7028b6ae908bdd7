package main

import (
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
