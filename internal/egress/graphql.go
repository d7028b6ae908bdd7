package egress

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/agent-vm/agent-vm/internal/gqlscan"
)

// maxInspectedBody bounds what the proxy reads of a request's body to
// judge it (a GraphQL rule), and of a refused request's body before it
// answers.
const maxInspectedBody = 1 << 20

// graphqlRead is a request's body read as GraphQL: its operations, or
// why it cannot be read with certainty.
type graphqlRead struct {
	ops []gqlscan.Operation
	err error
}

// readGraphQL reads req's body (at most maxInspectedBody) as a GraphQL
// request and puts what it read back in front of the rest. A body it
// would have to decode, or a request with a query string (which a server
// may merge with the body's keys), is not read.
func readGraphQL(req *http.Request) *graphqlRead {
	for _, ce := range req.Header.Values("Content-Encoding") {
		if !strings.EqualFold(strings.TrimSpace(ce), "identity") {
			return &graphqlRead{err: fmt.Errorf("a body with Content-Encoding %s", clip(ce))}
		}
	}
	if req.URL.RawQuery != "" {
		return &graphqlRead{err: errors.New("a request with a query string")}
	}
	if req.Body == nil || req.Body == http.NoBody {
		return &graphqlRead{err: errors.New("a request without a body")}
	}
	b, err := io.ReadAll(io.LimitReader(req.Body, maxInspectedBody+1))
	req.Body = readCloser{io.MultiReader(bytes.NewReader(b), req.Body), req.Body}
	switch {
	case err != nil:
		return &graphqlRead{err: fmt.Errorf("reading the body: %w", err)}
	case len(b) > maxInspectedBody:
		return &graphqlRead{err: fmt.Errorf("a body over %d MiB", maxInspectedBody>>20)}
	}
	ops, err := gqlscan.ScanRequest(b)
	return &graphqlRead{ops: ops, err: err}
}

// admits says why a GraphQL request does not meet the pattern's
// condition ("" when it does), and the mutations a condition would need
// to list to admit it (nil when none would).
func (pt RequestPattern) admits(g *graphqlRead) (why string, need []string) {
	if g.err != nil {
		return "its body is not GraphQL the proxy reads with certainty: " + clip(g.err.Error()), nil
	}
	var unlisted []string
	for _, op := range g.ops {
		switch op.Type {
		case gqlscan.Query:
		case gqlscan.Mutation:
			for _, f := range op.Fields {
				if !slices.Contains(need, f) {
					need = append(need, f)
				}
				if !slices.Contains(pt.Mutations, f) && !slices.Contains(unlisted, f) {
					unlisted = append(unlisted, f)
				}
			}
		default:
			return "a GraphQL " + op.Type, nil
		}
	}
	if len(unlisted) > 0 {
		return "the GraphQL mutation " + strings.Join(unlisted, ", ") + " is not on its list", need
	}
	return "", nil
}

// clip shortens what the guest wrote for a log line or a message.
func clip(s string) string {
	const max = 200
	if len(s) <= max {
		return s
	}
	return s[:max] + "…"
}
