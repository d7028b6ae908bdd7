package vminfo

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// jsonFields are the dotted JSON names of t's fields, nested structs
// descended into ("ssh.port").
func jsonFields(t reflect.Type, prefix string) []string {
	var out []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct && ft != reflect.TypeFor[time.Time]() && name != "net" && name != "forwards" {
			out = append(out, jsonFields(ft, prefix+name+".")...)
			continue
		}
		out = append(out, prefix+name)
	}
	return out
}

// TestTheDocumentedOutputIsTheOutput checks docs/usage.md's "JSON output"
// against Info: every field is documented there, and every state and
// suspend word in its rows.
func TestTheDocumentedOutputIsTheOutput(t *testing.T) {
	b, err := os.ReadFile("../../docs/usage.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "## JSON output")
	if i < 0 {
		t.Fatal(`docs/usage.md has no "## JSON output" section`)
	}
	doc = doc[i:]
	if j := strings.Index(doc[3:], "\n## "); j >= 0 {
		doc = doc[:j+3]
	}
	fields := jsonFields(reflect.TypeFor[Info](), "")
	if len(fields) < 30 {
		t.Fatalf("found %d fields in Info: the walk is broken", len(fields))
	}
	for _, f := range fields {
		if !strings.Contains(doc, "`"+f+"`") {
			t.Errorf("Info's field %q is not in docs/usage.md's JSON output table (hint: add a row, or say it there)", f)
		}
	}
	rowOf := func(field string) string {
		for line := range strings.Lines(doc) {
			if strings.HasPrefix(line, "| `"+field+"` |") {
				return line
			}
		}
		t.Fatalf("no row for %q in docs/usage.md's JSON output", field)
		return ""
	}
	for _, s := range []string{StateStopped, StateStarting, StateRunning, StatePaused, StateCrashed, StateSuspended, StateInvalid} {
		if !strings.Contains(rowOf("state"), "`"+s+"`") {
			t.Errorf("state %q is not in the state row of docs/usage.md's JSON output", s)
		}
	}
	for _, s := range []string{SuspendPaused, SuspendSaved} {
		if !strings.Contains(rowOf("suspend"), "`"+s+"`") {
			t.Errorf("suspend %q is not in the suspend row of docs/usage.md's JSON output", s)
		}
	}
}
