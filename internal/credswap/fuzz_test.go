package credswap

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// FuzzSwap: Swap never panics; what it lets out holds no placeholder of
// the host's secrets and no value of a secret not bound to the host
// (decoded Basic credentials included); it puts a value in no header but
// Authorization (ONE names none other); its errors hold no placeholder
// and no value.
func FuzzSwap(f *testing.F) {
	f.Add(ghPH, ghVal, oaPH, oaVal, uint8(0), "Authorization", "Bearer "+ghPH, "x-access-token", ghPH, "/p")
	f.Add(ghPH, ghVal, oaPH, oaVal, uint8(1), "X-Key", oaPH+oaPH, ghPH, "", "/"+ghPH)
	f.Add("ph-aaaaaaaa", "ph-aaaaaaa", "ph-bbbbbbbb", "zz", uint8(0), "X", "ph-aaaaaaaaa", "u", "p", "")
	f.Fuzz(func(t *testing.T, ph1, val1, ph2, val2 string, pick uint8, name, value, user, pass, path string) {
		set, err := New([]Secret{
			{Name: "ONE", Placeholder: ph1, Value: val1, Hosts: []string{"a.example"}},
			{Name: "TWO", Placeholder: ph2, Value: val2, Hosts: []string{"b.example"}},
		})
		if err != nil {
			return
		}
		host := []string{"a.example", "b.example", "c.example"}[pick%3]
		h := http.Header{}
		if name != "" {
			h[name] = []string{value}
		}
		h["Authorization"] = []string{"Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))}
		u := &url.URL{Scheme: "https", Host: host, Path: path}

		out, _, err := set.Swap(host, u, h)
		if err != nil {
			for _, secret := range []string{ph1, val1, ph2, val2} {
				if strings.Contains(err.Error(), secret) {
					t.Fatalf("the error %q holds a placeholder or value %q", err, secret)
				}
			}
			return
		}
		var bound, unboundVal []string
		for _, b := range set.secrets {
			if b.hosts[host] {
				bound = append(bound, b.Placeholder)
			} else {
				unboundVal = append(unboundVal, b.Value)
			}
		}
		check := func(what, s string) {
			for _, ph := range bound {
				if strings.Contains(s, ph) {
					t.Fatalf("%s %q holds the placeholder %q of a secret bound to %s", what, s, ph, host)
				}
			}
			for _, v := range unboundVal {
				if strings.Contains(s, v) {
					t.Fatalf("%s %q holds the value %q of a secret not bound to %s", what, s, v, host)
				}
			}
		}
		for k, vs := range out {
			check("header name", k)
			for _, v := range vs {
				check("header "+k, v)
				for _, b := range set.secrets {
					if k != "Authorization" && strings.Contains(v, b.Value) && !strings.Contains(strings.Join(h[k], "\n"), b.Value) {
						t.Fatalf("header %s %q got the value %q of secret %s", k, v, b.Value, b.Name)
					}
				}
			}
		}
		if user, pass, ok := (&http.Request{Header: out}).BasicAuth(); ok {
			check("the Basic user", user)
			check("the Basic password", pass)
		}
	})
}

// BenchmarkSwap is one typical API request through Swap: a dozen headers,
// a Bearer placeholder bound to the host, three secrets.
func BenchmarkSwap(b *testing.B) {
	set, err := New([]Secret{
		{Name: "GITHUB_TOKEN", Placeholder: ghPH, Value: ghVal, Hosts: []string{"github.com", "api.github.com"}},
		{Name: "OPENAI_API_KEY", Placeholder: oaPH, Value: oaVal, Hosts: []string{"api.openai.com"}},
		{Name: "ANTHROPIC_API_KEY", Placeholder: "agentvm-ph-anthropic-00112233445566", Value: "sk-ant-REALvalue22222222222222222", Hosts: []string{"api.anthropic.com"}},
	})
	if err != nil {
		b.Fatal(err)
	}
	u, _ := url.Parse("https://api.github.com/repos/o/r/pulls?state=open&per_page=100")
	h := http.Header{
		"Accept":               {"application/vnd.github+json"},
		"Accept-Encoding":      {"gzip, deflate, br"},
		"Authorization":        {"Bearer " + ghPH},
		"Content-Type":         {"application/json"},
		"Content-Length":       {"1234"},
		"User-Agent":           {"gh/2.40.0 (linux; amd64)"},
		"X-Github-Api-Version": {"2022-11-28"},
		"Connection":           {"keep-alive"},
		"Cache-Control":        {"no-cache"},
		"Accept-Language":      {"en-US,en;q=0.9"},
		"Traceparent":          {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		"Cookie":               {"_octo=GH1.1.123456789.1700000000; logged_in=no"},
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := set.Swap("api.github.com", u, h); err != nil {
			b.Fatal(err)
		}
	}
}
