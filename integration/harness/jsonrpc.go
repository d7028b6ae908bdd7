package harness

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// ReadJSONRPC reads the first JSON-RPC response from a Streamable HTTP
// answer: a JSON body, or the data of the first SSE event that carries a
// result or an error.
func ReadJSONRPC(resp *http.Response) ([]byte, error) {
	ct := resp.Header.Get("Content-Type")
	if strings.HasPrefix(ct, "application/json") {
		return io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	}
	if !strings.HasPrefix(ct, "text/event-stream") {
		return nil, fmt.Errorf("Content-Type %q, want application/json or text/event-stream", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	var data []string
	for sc.Scan() {
		line := sc.Text()
		if d, ok := strings.CutPrefix(line, "data:"); ok {
			data = append(data, strings.TrimPrefix(d, " "))
			continue
		}
		if line != "" || len(data) == 0 {
			continue
		}
		ev := []byte(strings.Join(data, "\n"))
		data = nil
		var probe map[string]json.RawMessage
		if json.Unmarshal(ev, &probe) == nil && (probe["result"] != nil || probe["error"] != nil) {
			return ev, nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("the event stream ended without a response")
}
