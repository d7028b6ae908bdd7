package debian

import (
	"encoding/json"

	"github.com/agent-vm/agent-vm/internal/state"
)

// TemplateSection implements backend.Templater: r's section less its
// provisioning count, marked Template (so that the template's seed holds
// the guest contract and nothing of one VM's).
func (b *Backend) TemplateSection(r *state.Record) (any, error) {
	section, err := rawSection(r)
	if err != nil {
		return nil, err
	}
	if section == nil {
		section = map[string]any{}
	}
	delete(section, "provision")
	section["template"] = true
	return section, nil
}

// TemplateBase implements backend.Templater: r's section less what a VM
// and its template differ in (the provisioning count, Template), as JSON
// with sorted keys ("null" for none). The keys of the templates built so
// far hash this very text, so it stays as it is.
func (b *Backend) TemplateBase(r *state.Record) (string, error) {
	section, err := rawSection(r)
	if err != nil {
		return "", err
	}
	delete(section, "provision")
	delete(section, "template")
	sb, _ := json.Marshal(section)
	return string(sb), nil
}

// rawSection is r's section as JSON values, so that the fields this
// version does not know are kept (nil for none).
func rawSection(r *state.Record) (map[string]any, error) {
	var section map[string]any
	if len(r.Settings) > 0 {
		if err := json.Unmarshal(r.Settings, &section); err != nil {
			return nil, err
		}
	}
	return section, nil
}
