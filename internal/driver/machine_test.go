package driver

import (
	"fmt"
	"strings"
	"testing"
)

func TestCheckShareCache(t *testing.T) {
	for _, ok := range []string{"none", "auto", "always"} {
		if err := CheckShareCache(ok); err != nil {
			t.Errorf("CheckShareCache(%q) = %v", ok, err)
		}
	}
	err := CheckShareCache("loose")
	if err == nil || !strings.Contains(err.Error(), `"loose"`) || !strings.Contains(err.Error(), "hint:") {
		t.Errorf("CheckShareCache(loose) = %v, want an error naming it with a hint", err)
	}
	if got := (Share{}).CacheMode(); got != DefaultShareCache {
		t.Errorf("unset cache mode reads %q, want %q", got, DefaultShareCache)
	}
}

// TestSealedPrintsNoValue: a Network printed whole shows no secret.
func TestSealedPrintsNoValue(t *testing.T) {
	n := Network{Addr: "10.0.2.100", ProxyInput: Sealed(`{"value":"canary-sealed"}`)}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
		if got := fmt.Sprintf(verb, n); strings.Contains(got, "canary") || strings.Contains(got, "63616e617279") {
			t.Errorf("%s of a Network shows the value: %s", verb, got)
		}
	}
	if string(n.ProxyInput) != `{"value":"canary-sealed"}` {
		t.Errorf("the bytes themselves changed")
	}
}
