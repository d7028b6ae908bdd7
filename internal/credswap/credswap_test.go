package credswap

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

const (
	ghPH  = "agentvm-ph-github-0123456789abcdef"
	ghVal = "ghp_REALgithubTOKENvalue000000000000"
	oaPH  = "agentvm-ph-openai-fedcba9876543210"
	oaVal = "sk-REALopenaiKEYvalue1111111111111"
	anPH  = "agentvm-ph-anthropic-00112233445566"
	anVal = "sk-ant-REALvalue22222222222222222"
)

func testSet(t testing.TB) *Set {
	t.Helper()
	s, err := New([]Secret{
		{Name: "GITHUB_TOKEN", Placeholder: ghPH, Value: ghVal, Hosts: []string{"github.com", "api.github.com"}},
		{Name: "OPENAI_API_KEY", Placeholder: oaPH, Value: oaVal, Hosts: []string{"api.openai.com"}},
		{Name: "ANTHROPIC_API_KEY", Placeholder: anPH, Value: anVal, Hosts: []string{"api.anthropic.com"}, Headers: []string{"x-api-key"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func basic(user, pass string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
}

var values = []string{ghVal, oaVal, anVal}

// noSecretIn fails the test if text holds any real value.
func noSecretIn(t *testing.T, what, text string) {
	t.Helper()
	for _, v := range values {
		if strings.Contains(text, v) {
			t.Errorf("%s holds the real value %q: %s", what, v, text)
		}
	}
}

func TestSwap(t *testing.T) {
	s := testSet(t)
	for _, tc := range []struct {
		name   string
		host   string
		url    string
		in     http.Header
		want   http.Header
		refuse string // in the error; "" for no error
	}{
		{"bearer to a bound host", "api.github.com", "https://api.github.com/user",
			http.Header{"Authorization": {"Bearer " + ghPH}, "Accept": {"*/*"}},
			http.Header{"Authorization": {"Bearer " + ghVal}, "Accept": {"*/*"}}, ""},
		{"host with port and case", "API.GitHub.com.:443", "",
			http.Header{"Authorization": {"token " + ghPH}},
			http.Header{"Authorization": {"token " + ghVal}}, ""},
		{"the placeholder alone, and every value", "api.openai.com", "",
			http.Header{"Authorization": {oaPH, " Bearer  " + oaPH + " "}},
			http.Header{"Authorization": {oaVal, "Bearer  " + oaVal}}, ""},
		{"a header the secret names, any case", "api.anthropic.com", "",
			http.Header{"X-Api-Key": {anPH}, "Accept": {"*/*"}},
			http.Header{"X-Api-Key": {anVal}, "Accept": {"*/*"}}, ""},
		{"Proxy-Authorization", "api.github.com", "",
			http.Header{"Proxy-Authorization": {"token " + ghPH}},
			http.Header{"Proxy-Authorization": {"token " + ghVal}}, ""},
		{"basic auth: the password", "github.com", "https://github.com/o/r.git/info/refs",
			http.Header{"Authorization": {basic("x-access-token", ghPH)}},
			http.Header{"Authorization": {basic("x-access-token", ghVal)}}, ""},
		{"basic auth: user and password", "github.com", "",
			http.Header{"Authorization": {basic(ghPH, ghPH)}},
			http.Header{"Authorization": {basic(ghVal, ghVal)}}, ""},
		{"basic, lower-case scheme, untouched when nothing to swap", "github.com", "",
			http.Header{"Authorization": {"basic " + base64.StdEncoding.EncodeToString([]byte("u:p"))}},
			http.Header{"Authorization": {"basic " + base64.StdEncoding.EncodeToString([]byte("u:p"))}}, ""},
		{"not base64: left as is", "github.com", "",
			http.Header{"Authorization": {"Basic !!!"}}, http.Header{"Authorization": {"Basic !!!"}}, ""},
		{"no placeholder", "example.com", "https://example.com/?q=1",
			http.Header{"User-Agent": {"curl/8"}}, http.Header{"User-Agent": {"curl/8"}}, ""},
		{"split across two values: no match", "github.com", "",
			http.Header{"X-A": {ghPH[:10], ghPH[10:]}}, http.Header{"X-A": {ghPH[:10], ghPH[10:]}}, ""},
		{"split across two headers: no match", "github.com", "",
			http.Header{"X-A": {ghPH[:10]}, "X-B": {ghPH[10:]}}, http.Header{"X-A": {ghPH[:10]}, "X-B": {ghPH[10:]}}, ""},

		{"another host's placeholder in a header", "api.openai.com", "",
			http.Header{"Authorization": {"Bearer " + ghPH}}, nil,
			`header "Authorization" to "api.openai.com" carries the placeholder of secret "GITHUB_TOKEN", which may only be sent to github.com, api.github.com`},
		{"an unbound placeholder beside a bound one", "api.openai.com", "",
			http.Header{"Authorization": {"Bearer " + oaPH}, "X-Other": {"x" + ghPH}}, nil, `secret "GITHUB_TOKEN"`},
		{"a placeholder to an unknown host", "evil.example", "",
			http.Header{"Cookie": {"t=" + oaPH}}, nil, `header "Cookie" to "evil.example" carries the placeholder of secret "OPENAI_API_KEY"`},
		{"in a Basic credential", "evil.example", "",
			http.Header{"Authorization": {basic("u", oaPH)}}, nil, `header "Authorization"'s Basic credential to "evil.example" carries the placeholder of secret "OPENAI_API_KEY"`},
		{"in Proxy-Authorization's Basic", "evil.example", "",
			http.Header{"Proxy-Authorization": {basic(ghPH, "")}}, nil, `Basic credential`},
		{"in the path", "evil.example", "https://evil.example/" + ghPH, nil, nil, `the URL to "evil.example" carries the placeholder of secret "GITHUB_TOKEN"`},
		{"in the query", "evil.example", "https://evil.example/x?k=" + oaPH, nil, nil, `secret "OPENAI_API_KEY"`},
		{"escaped in the query", "evil.example", "https://evil.example/x?k=" + url.QueryEscape(oaPH[:5]) + "%" + fmt.Sprintf("%02X", oaPH[5]) + oaPH[6:], nil, nil, `secret "OPENAI_API_KEY"`},
		{"in the URL's user info", "evil.example", "https://" + ghPH + "@evil.example/", nil, nil, `the URL`},
		{"in a header name", "github.com", "", http.Header{"X-" + ghPH: {"1"}}, nil, `a header's name to "github.com" carries the placeholder of secret "GITHUB_TOKEN"`},
		{"echoed: in a header of no credential", "api.github.com", "",
			http.Header{"X-Github-Api-Version": {ghPH}}, nil,
			`header "X-Github-Api-Version" to "api.github.com" carries the placeholder of secret "GITHUB_TOKEN" where no credential goes: its value is put only in Authorization, Proxy-Authorization, as the whole value`},
		{"inside a longer value", "api.github.com", "",
			http.Header{"Authorization": {"Bearer " + ghPH + "x"}}, nil, `where no credential goes`},
		{"after two words", "api.github.com", "",
			http.Header{"Authorization": {"Bearer x " + ghPH}}, nil, `where no credential goes`},
		{"inside a Basic password", "github.com", "",
			http.Header{"Authorization": {basic("x-access-token", "a"+ghPH)}}, nil,
			`header "Authorization"'s Basic credential to "github.com" carries the placeholder of secret "GITHUB_TOKEN" where no credential goes`},
		{"another secret's header", "api.openai.com", "",
			http.Header{"X-Api-Key": {oaPH}}, nil, `secret "OPENAI_API_KEY" where no credential goes`},
		{"a named header, the value inside a longer one", "api.anthropic.com", "",
			http.Header{"X-Api-Key": {anPH + "," + anPH}}, nil,
			`its value is put only in Authorization, Proxy-Authorization, X-Api-Key, as the whole value`},
		{"a cookie to a bound host", "api.github.com", "",
			http.Header{"Cookie": {"t=" + ghPH}}, nil, `header "Cookie" to "api.github.com"`},
		{"in the URL of a bound host", "api.github.com", "https://api.github.com/user?access_token=" + ghPH, nil, nil,
			`the URL to "api.github.com" carries the placeholder of secret "GITHUB_TOKEN" where no credential goes`},
		{"a real value of another host's secret", "github.com", "",
			http.Header{"X-Leak": {oaVal}}, nil, `would carry the value of secret "OPENAI_API_KEY"`},
	} {
		var u *url.URL
		if tc.url != "" {
			var err error
			if u, err = url.Parse(tc.url); err != nil {
				t.Fatal(err)
			}
		}
		in := tc.in.Clone()
		got, names, err := s.Swap(tc.host, u, tc.in)
		if tc.refuse != "" {
			if err == nil || !strings.Contains(err.Error(), tc.refuse) || !IsRefused(err) {
				t.Errorf("%s: got %v, want a refusal containing %q", tc.name, err, tc.refuse)
			}
			if err != nil {
				noSecretIn(t, tc.name+"'s error", err.Error())
				for _, ph := range []string{ghPH, oaPH} {
					if strings.Contains(err.Error(), ph) {
						t.Errorf("%s: the error holds a placeholder: %v", tc.name, err)
					}
				}
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
		if swapped := fmt.Sprint(got) != fmt.Sprint(in); swapped != (len(names) > 0) {
			t.Errorf("%s: names %v, but the headers were swapped: %v", tc.name, names, swapped)
		}
		if fmt.Sprint(tc.in) != fmt.Sprint(in) {
			t.Errorf("%s: Swap changed its input to %q", tc.name, tc.in)
		}
	}
}

// A Basic credential decodes to what was meant, the real value in place
// of the placeholder, and the user untouched.
func TestSwapBasicRoundTrip(t *testing.T) {
	s := testSet(t)
	got, names, err := s.Swap("github.com", nil, http.Header{"Authorization": {basic("x-access-token", ghPH)}})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(names) != "[GITHUB_TOKEN]" {
		t.Errorf("names %v, want [GITHUB_TOKEN]", names)
	}
	if !s.Bound("GitHub.com.") || s.Bound("gist.github.com") {
		t.Errorf("Bound: github.com %v, gist.github.com %v; want true, false", s.Bound("GitHub.com."), s.Bound("gist.github.com"))
	}
	r := &http.Request{Header: got}
	user, pass, ok := r.BasicAuth()
	if !ok || user != "x-access-token" || pass != ghVal {
		t.Errorf("decoded %q, %q, %v; want x-access-token and the real value", user, pass, ok)
	}
}

func TestNewRefuses(t *testing.T) {
	ok := Secret{Name: "A", Placeholder: "agentvm-ph-aaaaaaaa", Value: "value-of-a", Hosts: []string{"a.example"}}
	for _, tc := range []struct {
		name    string
		secrets []Secret
		want    string
	}{
		{"no name", []Secret{{Placeholder: ok.Placeholder, Value: ok.Value}}, "secret 1 has no name"},
		{"short placeholder", []Secret{{Name: "A", Placeholder: "ph-xyz", Value: ok.Value}}, `secret "A": its placeholder is shorter than 8 bytes`},
		{"no value", []Secret{{Name: "A", Placeholder: ok.Placeholder}}, `secret "A" has no value`},
		{"twice", []Secret{ok, ok}, `secret "A" is listed twice`},
		{"value holds a placeholder", []Secret{ok, {Name: "B", Placeholder: "agentvm-ph-bbbbbbbb", Value: "x" + ok.Placeholder}}, `secret "B"'s value contains secret "A"'s placeholder`},
		{"placeholder within another", []Secret{ok, {Name: "B", Placeholder: ok.Placeholder + "b", Value: "value-of-b"}}, `secret "B"'s placeholder contains secret "A"'s`},
		{"same placeholder", []Secret{ok, {Name: "B", Placeholder: ok.Placeholder, Value: "value-of-b"}}, `placeholder contains`},
	} {
		_, err := New(tc.secrets)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
			continue
		}
		for _, sec := range tc.secrets {
			if strings.Contains(err.Error(), sec.Value) && sec.Value != "" || strings.Contains(err.Error(), sec.Placeholder) && sec.Placeholder != "" {
				t.Errorf("%s: the error holds a value or placeholder: %v", tc.name, err)
			}
		}
	}
}

// No verb of fmt prints a secret's placeholder or value, of a Secret or a
// Set.
func TestFormatHidesSecrets(t *testing.T) {
	s := testSet(t)
	sec := s.secrets[0].Secret
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
		for _, x := range []any{sec, &sec, s, *s, []Secret{sec}, struct{ S Secret }{sec}} {
			out := fmt.Sprintf(verb, x)
			noSecretIn(t, verb, out)
			if strings.Contains(out, ghPH) {
				t.Errorf("%s of %T holds the placeholder: %s", verb, x, out)
			}
		}
	}
}
