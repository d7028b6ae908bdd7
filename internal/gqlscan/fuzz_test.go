package gqlscan

import (
	"encoding/json"
	"reflect"
	"regexp"
	"testing"
)

var nameRE = regexp.MustCompile(`^[_A-Za-z][_0-9A-Za-z]*$`)

// FuzzScan: Scan ends on any input without panicking; what it reads has
// operations of the three types with names for fields; a comment or
// white space around the document changes nothing; the same document in
// a request's JSON body reads the same.
func FuzzScan(f *testing.F) {
	for _, doc := range []string{
		ghCreatePR, ghMerge, ghStatus,
		`{ viewer { login } }`,
		`mutation { a: mergePullRequest(input: {x: [1, -2.5e3, "s", """b"""]}) { id } }`,
		`# mutation
		query { search(query: "mutation {", type: ISSUE) { issueCount } }`,
		`mutation { ...F ... on Mutation { b } } fragment F on Mutation { c }`,
		`query Q($a: [ID!]! = ["x"] @d) @e(f: $a) { g }`,
		`subscription { s }`,
		`mutation { a(x: """ \""" """) }`,
	} {
		f.Add(doc)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		ops, err := Scan(doc)
		if err != nil {
			return
		}
		for _, op := range ops {
			if op.Type != Query && op.Type != Mutation && op.Type != Subscription {
				t.Fatalf("Scan(%q): an operation of type %q", doc, op.Type)
			}
			if len(op.Fields) == 0 {
				t.Fatalf("Scan(%q): an operation without fields: %+v", doc, op)
			}
			for _, field := range op.Fields {
				if !nameRE.MatchString(field) {
					t.Fatalf("Scan(%q): field %q is not a name", doc, field)
				}
			}
		}
		for _, around := range []string{" " + doc, "# comment\n" + doc, doc + "\n# comment", doc + ","} {
			again, err := Scan(around)
			if err != nil || !reflect.DeepEqual(again, ops) {
				t.Fatalf("Scan(%q) = %+v, but with %q around it: %+v, %v", doc, ops, around, again, err)
			}
		}
		body, err := json.Marshal(map[string]string{"query": doc})
		if err != nil {
			t.Fatal(err)
		}
		again, err := ScanRequest(body)
		if err != nil || !reflect.DeepEqual(again, ops) {
			t.Fatalf("Scan(%q) = %+v, but in a request body: %+v, %v", doc, ops, again, err)
		}
	})
}
