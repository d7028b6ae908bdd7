package vm

import (
	"context"
	"fmt"

	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/image"
)

// The base images VMs boot: `agent-vm image build|pull|list|prune`.

// Image defaults, for the CLI's flags and messages.
const (
	DefaultImageRelease = image.DefaultRelease
	DefaultImageMirror  = image.DefaultMirror
)

// PullableImages are the names `image pull` knows.
func PullableImages() []string { return image.PullNames() }

// ImageBuildOptions are `image build`'s flags.
type ImageBuildOptions struct {
	Release string // "" = DefaultImageRelease
	Mirror  string // "" = DefaultImageMirror
	Force   bool   // build a new version even if a current one is cached
}

// BuildImage builds the Debian base image into the image cache.
func (m *Manager) BuildImage(ctx context.Context, o ImageBuildOptions) (image.Info, error) {
	img, err := m.buildImage(ctx, o)
	if err != nil {
		return image.Info{}, err
	}
	return img.Info(), nil
}

func (m *Manager) buildImage(ctx context.Context, o ImageBuildOptions) (*image.Image, error) {
	return image.Build(ctx, image.BuildOptions{Release: o.Release, Mirror: o.Mirror, Force: o.Force,
		Cache: m.Dirs.Images, Runner: m.Run, Progress: m.Progress, Logger: m.Log.Named("image")})
}

// FirstImage builds the base image on a host that has none, as the first
// start there does: the packages the build needs first (hostsetup.First).
func (m *Manager) FirstImage(ctx context.Context) (*image.Image, error) {
	if err := m.setupFirst(ctx, hostpkgs.Image); err != nil {
		return nil, err
	}
	return m.buildImage(ctx, ImageBuildOptions{})
}

// ImagePullOptions are `image pull`'s arguments.
type ImagePullOptions struct {
	Name    string // see PullableImages
	BaseURL string // "" = the distribution's site
	Force   bool
}

// PullImage downloads an official cloud image and checks its checksum.
func (m *Manager) PullImage(ctx context.Context, o ImagePullOptions) (image.Info, error) {
	img, err := image.Pull(ctx, image.PullOptions{Name: o.Name, BaseURL: o.BaseURL, Force: o.Force,
		Cache: m.Dirs.Images, Runner: m.Run, Progress: m.Progress, Logger: m.Log.Named("image")})
	if err != nil {
		return image.Info{}, err
	}
	return img.Info(), nil
}

// Images lists the cached images.
func (m *Manager) Images() ([]image.Info, error) { return image.Infos(m.ImageDir()) }

// PruneImages removes cached image versions that were replaced and that no
// VM's disk is based on, and returns what it removed. A VM whose record is
// unreadable might use any version, so then nothing is removed.
func (m *Manager) PruneImages(ctx context.Context) ([]string, error) {
	entries, err := m.List(ctx)
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	for _, en := range entries {
		if en.Record == nil {
			return nil, fmt.Errorf("VM directory %s has an unreadable record, so agent-vm cannot tell which images it uses (hint: fix or destroy it first)", en.Layout.Dir)
		}
		be, ok := m.Backends[en.Record.Backend]
		if !ok {
			return nil, fmt.Errorf("VM %q uses the %s backend, which this agent-vm does not have, so it cannot tell which images that VM uses (hint: use an agent-vm build with that backend to prune)", en.Record.Branch, en.Record.Backend)
		}
		for _, img := range be.ImagesInUse(en.Layout) {
			used[img] = true
		}
	}
	for img := range m.templateImages() {
		used[img] = true
	}
	return image.Prune(ctx, m.Dirs.Images, func(disk string) bool { return used[disk] })
}
