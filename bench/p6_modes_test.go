package main

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseP6Modes(t *testing.T) {
	got, err := parseP6Modes("auto, always+writeback,none,auto+tp4+t10,9p")
	if err != nil {
		t.Fatal(err)
	}
	want := []p6Mode{
		{Name: "auto", Cache: "auto"},
		{Name: "always+writeback", Cache: "always", Extra: []string{"-o", "writeback"}},
		{Name: "none", Cache: "none"},
		{Name: "auto+tp4+t10", Cache: "auto", Extra: []string{"--thread-pool-size=4", "-o", "timeout=10"}},
		{Name: "9p"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("modes %+v, want %+v", got, want)
	}
	var labels []string
	for _, m := range got {
		labels = append(labels, m.label())
	}
	if l := strings.Join(labels, " "); l != "virtiofs virtiofs-always+writeback virtiofs-none virtiofs-auto+tp4+t10 9p" {
		t.Errorf("labels %q", l)
	}
	def, err := parseP6Modes("")
	if err != nil || len(def) != 2 || def[0].Name != "auto" || def[1].Name != "9p" {
		t.Errorf("default modes %+v, %v; want auto, 9p", def, err)
	}
	for _, bad := range []string{"fast", "auto+zoom", "auto+tx", "auto,auto", "always+t-1"} {
		if _, err := parseP6Modes(bad); err == nil || !strings.Contains(err.Error(), p6ModesEnv) {
			t.Errorf("parseP6Modes(%q) = %v, want an error naming %s", bad, err, p6ModesEnv)
		}
	}
}
