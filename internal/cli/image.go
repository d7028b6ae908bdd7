package cli

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cloudinit"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/vm"
)

func imageCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:  "image",
		Usage: "build, download and list the base disk images VMs boot from",
		Subcommands: []*cli.Command{
			{
				Name:      "build",
				Usage:     "build the Debian base image with mmdebstrap (root; about 2 minutes)",
				ArgsUsage: " ",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "release", Value: image.DefaultRelease, Usage: "Debian release (codename)"},
					&cli.StringFlag{Name: "mirror", Value: image.DefaultMirror, Usage: "Debian mirror URL"},
					&cli.BoolFlag{Name: "force", Usage: "build a new version even if a current one is cached (VMs keep the version they were made on)"},
				},
				Action: func(cliCtx *cli.Context) error {
					if err := noArgs(cliCtx); err != nil {
						return err
					}
					e := newEnv(cliCtx, stdio)
					img, err := image.Build(cliCtx.Context, image.BuildOptions{
						Release: cliCtx.String("release"), Mirror: cliCtx.String("mirror"), Force: cliCtx.Bool("force"),
						CacheDir: e.imageDir(), Runner: e.run, Progress: stdio.Err, Logger: e.log.Named("image"),
					})
					if err != nil {
						return err
					}
					fmt.Fprintf(stdio.Out, "image %s ready: %s (%s)\n", img.Name, img.Disk, humanBytes(img.Manifest.SizeBytes))
					return nil
				},
			},
			{
				Name:      "pull",
				Usage:     "download an official cloud image and verify its checksum",
				ArgsUsage: "debian-12|ubuntu-24.04",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "base-url", Usage: "where to download from (default: the distribution's site)"},
					&cli.BoolFlag{Name: "force", Usage: "download again even if cached"},
				},
				Action: func(cliCtx *cli.Context) error {
					if cliCtx.NArg() != 1 {
						return usagef("image pull needs one image name: %v", image.PullNames())
					}
					e := newEnv(cliCtx, stdio)
					img, err := image.Pull(cliCtx.Context, image.PullOptions{
						Name: cliCtx.Args().First(), BaseURL: cliCtx.String("base-url"), Force: cliCtx.Bool("force"),
						CacheDir: e.imageDir(), Runner: e.run, Progress: stdio.Err, Logger: e.log.Named("image"),
					})
					if err != nil {
						return err
					}
					fmt.Fprintf(stdio.Out, "image %s ready: %s (use it with `agent-vm create --image %s`)\n", img.Name, img.Disk, img.Disk)
					return nil
				},
			},
			{
				Name:      "prune",
				Usage:     "remove cached image versions that were replaced and that no VM's disk is based on",
				ArgsUsage: " ",
				Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
					if err := noArgs(cliCtx); err != nil {
						return err
					}
					entries, err := m.List(cliCtx.Context)
					if err != nil {
						return err
					}
					used := map[string]bool{}
					for _, en := range entries {
						if en.Record == nil {
							// An unreadable VM might use any version: keep all.
							return fmt.Errorf("VM directory %s has an unreadable record, so agent-vm cannot tell which images it uses (hint: fix or destroy it first)", en.Layout.Dir)
						}
						if b := cloudinit.BaseOf(en.Layout); b != "" {
							used[b] = true
						}
					}
					removed, err := image.Prune(cliCtx.Context, e.imageDir(), func(disk string) bool { return used[disk] })
					for _, r := range removed {
						fmt.Fprintf(stdio.Out, "removed %s\n", r)
					}
					if err == nil && len(removed) == 0 {
						fmt.Fprintln(stdio.Out, "nothing to prune")
					}
					return err
				}),
			},
			{
				Name:      "list",
				Usage:     "list the cached images",
				ArgsUsage: " ",
				Flags:     []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
				Action: func(cliCtx *cli.Context) error {
					if err := noArgs(cliCtx); err != nil {
						return err
					}
					e := newEnv(cliCtx, stdio)
					imgs, err := image.List(e.imageDir())
					if err != nil {
						return err
					}
					if cliCtx.Bool("json") {
						out := make([]imageInfo, 0, len(imgs))
						for _, i := range imgs {
							out = append(out, newImageInfo(i))
						}
						return writeJSON(stdio.Out, out)
					}
					if len(imgs) == 0 {
						fmt.Fprintf(stdio.Out, "no images in %s (hint: `sudo agent-vm image build` or `agent-vm image pull debian-12`)\n", e.imageDir())
						return nil
					}
					tw := tabwriter.NewWriter(stdio.Out, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "NAME\tKIND\tSIZE\tCREATED\tDISK")
					for _, i := range imgs {
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", i.Name, i.Manifest.Kind, humanBytes(i.Manifest.SizeBytes),
							i.Manifest.Created.Local().Format("2006-01-02 15:04"), i.Disk)
					}
					return tw.Flush()
				},
			},
		},
	}
}

// imageInfo is what `image list --json` prints per image.
type imageInfo struct {
	Name          string `json:"name"`
	Kind          string `json:"kind"`
	Disk          string `json:"disk"`
	Format        string `json:"format"`
	SizeBytes     int64  `json:"size_bytes"`
	Kernel        string `json:"kernel,omitempty"`
	KernelVersion string `json:"kernel_version,omitempty"`
	Created       string `json:"created"`
}

func newImageInfo(i *image.Image) imageInfo {
	return imageInfo{Name: i.Name, Kind: i.Manifest.Kind, Disk: i.Disk, Format: i.Format, SizeBytes: i.Manifest.SizeBytes,
		Kernel: i.Kernel, KernelVersion: i.Manifest.KernelVersion, Created: i.Manifest.Created.Format("2006-01-02T15:04:05Z07:00")}
}

// imageDir is the image cache: $XDG_CACHE_HOME/agent-vm/images. Under sudo
// (building an image needs root) it is the invoking user's, so
// `sudo agent-vm image build` makes the image that user's VMs boot.
func (e *env) imageDir() string {
	if u := e.stdio.Getenv("SUDO_USER"); u != "" && os.Geteuid() == 0 && e.stdio.Getenv("XDG_CACHE_HOME") == "" {
		if pw, err := user.Lookup(u); err == nil && pw.HomeDir != "" {
			return filepath.Join(pw.HomeDir, ".cache", "agent-vm", "images")
		}
	}
	return filepath.Join(e.cacheDir(), "images")
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%d bytes", n)
	}
}
