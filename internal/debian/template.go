package debian

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agent-vm/agent-vm/internal/image"

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

// TemplateStale implements backend.Templater: a template made on a base
// image that new VMs of its section no longer boot (a newer image was
// built, or the image is gone) fits none of them (fitsTemplate refuses
// it; they boot cold).
func (b *Backend) TemplateStale(_ context.Context, l state.Layout, r *state.Record) string {
	raw, err := os.ReadFile(filepath.Join(l.Dir, DiskInfoFile))
	var info DiskInfo
	if err != nil || json.Unmarshal(raw, &info) != nil {
		return "its disk.json is unreadable"
	}
	s, err := state.SectionOf[Settings](r)
	if err != nil {
		return "its record is unreadable"
	}
	now := s.Image // an --image VM's base is that file
	if now == "" {
		img, err := image.Lookup(b.ImageDir, image.DefaultBuildName) // never built here: listing must not build
		if err != nil {
			return "new VMs have no base image to boot yet (`agent-vm image build`)"
		}
		now = img.Disk
	}
	if now != info.Base {
		return fmt.Sprintf("made on the base image %s; new VMs boot %s, so none starts from it", info.Base, now)
	}
	return ""
}
