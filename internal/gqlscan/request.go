package gqlscan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// ScanRequest reads the JSON body of a GraphQL request over HTTP,
// {"query": "...", "variables": {...}, "operationName": "..."}, and scans
// its query (Scan). Only these keys are taken, each once and spelled
// exactly so: a reader that matched keys regardless of case, or took the
// first of two, would run another query than the one scanned. A batch (a
// JSON array) and a request without a query, a persisted query's, are
// refused. All the document's operations are returned, whichever
// operationName picks.
func ScanRequest(body []byte) ([]Operation, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("the body is not a JSON object (one GraphQL request)")
	}
	var query *string
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("the body is not JSON: %w", err)
		}
		key, _ := t.(string)
		if seen[key] {
			return nil, fmt.Errorf("the body has the key %q twice", key)
		}
		seen[key] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("the body is not JSON: %w", err)
		}
		switch key {
		case "query":
			var q string
			if err := json.Unmarshal(raw, &q); err != nil {
				return nil, errors.New(`the body's "query" is not a string`)
			}
			query = &q
		case "operationName":
			var n *string
			if err := json.Unmarshal(raw, &n); err != nil {
				return nil, errors.New(`the body's "operationName" is not a string`)
			}
		case "variables":
		default:
			return nil, fmt.Errorf("the body has the key %q (only query, variables and operationName are read)", key)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, fmt.Errorf("the body is not JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("the body has more after its JSON object")
	}
	if query == nil {
		return nil, errors.New(`the body has no "query"`)
	}
	return Scan(*query)
}
