package image

import "time"

// Info is one cached image as `agent-vm image list --json` prints it (and
// build and pull report it).
type Info struct {
	Name          string    `json:"name"`
	Kind          string    `json:"kind"`
	Disk          string    `json:"disk"`
	Format        string    `json:"format"`
	SizeBytes     int64     `json:"size_bytes"`
	Kernel        string    `json:"kernel,omitempty"`
	KernelVersion string    `json:"kernel_version,omitempty"`
	Created       time.Time `json:"created"`
}

// Info describes i for people and JSON.
func (i *Image) Info() Info {
	return Info{Name: i.Name, Kind: i.Manifest.Kind, Disk: i.Disk, Format: i.Format, SizeBytes: i.Manifest.SizeBytes,
		Kernel: i.Kernel, KernelVersion: i.Manifest.KernelVersion, Created: i.Manifest.Created.Truncate(time.Second)}
}

// Infos lists the images of the cache dir (see List).
func Infos(dir string) ([]Info, error) {
	imgs, err := List(dir)
	if err != nil {
		return nil, err
	}
	out := make([]Info, 0, len(imgs))
	for _, i := range imgs {
		out = append(out, i.Info())
	}
	return out, nil
}
