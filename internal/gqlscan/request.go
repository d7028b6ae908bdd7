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
	if loneSurrogate(body) {
		// encoding/json reads one as U+FFFD; a server's parser may read
		// it otherwise (or drop it), and then the two read different
		// requests.
		return nil, errors.New(`the body has a lone surrogate escape (a \uD800-\uDFFF without its pair)`)
	}
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

// loneSurrogate says whether the JSON text b has a \u escape of a UTF-16
// surrogate that is not half of a pair: a high one (D800-DBFF) not right
// before a low one (DC00-DFFF), or a low one not right after a high one.
func loneSurrogate(b []byte) bool {
	unit := func(i int) (rune, bool) { // the \uXXXX escape at i, if one is
		if i+6 > len(b) || b[i] != '\\' || b[i+1] != 'u' {
			return 0, false
		}
		var r rune
		for _, c := range b[i+2 : i+6] {
			switch {
			case c >= '0' && c <= '9':
				r = r<<4 | rune(c-'0')
			case c >= 'a' && c <= 'f':
				r = r<<4 | rune(c-'a'+10)
			case c >= 'A' && c <= 'F':
				r = r<<4 | rune(c-'A'+10)
			default:
				return 0, false
			}
		}
		return r, true
	}
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		r, ok := unit(i)
		if !ok {
			i++ // another escape: \\, \", \n, ...
			continue
		}
		switch {
		case r >= 0xD800 && r <= 0xDBFF:
			if lo, ok := unit(i + 6); !ok || lo < 0xDC00 || lo > 0xDFFF {
				return true
			}
			i += 11 // the pair
		case r >= 0xDC00 && r <= 0xDFFF:
			return true
		default:
			i += 5
		}
	}
	return false
}
