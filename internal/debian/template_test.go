package debian

import (
	"encoding/json"
	"testing"

	"github.com/agent-vm/agent-vm/internal/state"
)

// A template's section is the VM's, less its provisioning count, marked
// Template; what a template must share with a VM (a part of its key) is
// the section less both, as the keys of templates built so far say it.
func TestTemplateSectionAndBase(t *testing.T) {
	b := &Backend{}
	for _, tc := range []struct {
		settings      any
		section, base string
	}{
		{Settings{Image: "/i.qcow2", Provision: 2}, `{"image":"/i.qcow2","template":true}`, `{"image":"/i.qcow2"}`},
		{Settings{Provision: 1, Template: true}, `{"template":true}`, `{}`},
		{nil, `{"template":true}`, `null`},
	} {
		r := &state.Record{Backend: Name}
		if tc.settings != nil {
			if err := r.SetSection(tc.settings); err != nil {
				t.Fatal(err)
			}
		}
		base, err := b.TemplateBase(r)
		if err != nil || base != tc.base {
			t.Errorf("%+v: base %q, %v; want %q", tc.settings, base, err, tc.base)
		}
		section, err := b.TemplateSection(r)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := json.Marshal(section); string(got) != tc.section {
			t.Errorf("%+v: template's section %s, want %s", tc.settings, got, tc.section)
		}
	}
}
