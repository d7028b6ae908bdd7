package driver

import (
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
