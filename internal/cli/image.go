package cli

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/hostsetup"
	"github.com/agent-vm/agent-vm/internal/vm"
)

func imageCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:  "image",
		Usage: "the base disk images VMs boot from (build, pull, list, prune)",
		Subcommands: []*cli.Command{
			{
				Name:  "build",
				Usage: "build the Debian base image with mmdebstrap (root; about 2 minutes)",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "release", Value: hostsetup.DefaultImageRelease, Usage: "Debian release (codename)"},
					&cli.StringFlag{Name: "mirror", Value: hostsetup.DefaultImageMirror, Usage: "Debian mirror URL"},
					&cli.BoolFlag{Name: "force", Usage: "build a new version even if a current one is cached (VMs keep the version they were made on)"},
				},
				Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
					if err := cmdline.NoArgs(cliCtx); err != nil {
						return err
					}
					img, err := m.Host.BuildImage(cliCtx.Context, hostsetup.ImageBuildOptions{
						Release: cliCtx.String("release"), Mirror: cliCtx.String("mirror"), Force: cliCtx.Bool("force")})
					if err != nil {
						return err
					}
					fmt.Fprintf(stdio.Out, "image %s ready: %s (%s)\n", img.Name, img.Disk, humanBytes(img.SizeBytes))
					return nil
				}),
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
						return cmdline.Usagef("image pull needs one image name: %v", hostsetup.PullableImages())
					}
					return withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
						img, err := m.Host.PullImage(cliCtx.Context, hostsetup.ImagePullOptions{
							Name: cliCtx.Args().First(), BaseURL: cliCtx.String("base-url"), Force: cliCtx.Bool("force")})
						if err != nil {
							return err
						}
						fmt.Fprintf(stdio.Out, "image %s ready: %s (use it with `agent-vm create --image %s`)\n", img.Name, img.Disk, img.Disk)
						return nil
					})(cliCtx)
				},
			},
			{
				Name:  "prune",
				Usage: "remove cached image versions that were replaced and that no VM's disk is based on",
				Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
					if err := cmdline.NoArgs(cliCtx); err != nil {
						return err
					}
					removed, err := m.Host.PruneImages(cliCtx.Context)
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
				Name:  "list",
				Usage: "list the cached images",
				Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
				Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
					if err := cmdline.NoArgs(cliCtx); err != nil {
						return err
					}
					imgs, err := m.Host.Images()
					if err != nil {
						return err
					}
					if cliCtx.Bool("json") {
						return writeJSON(stdio.Out, imgs)
					}
					if len(imgs) == 0 {
						fmt.Fprintf(stdio.Out, "no images in %s (hint: `sudo agent-vm image build` or `agent-vm image pull debian-12`)\n", m.ImageDir())
						return nil
					}
					rows := [][]string{{"NAME", "KIND", "SIZE", "CREATED", "DISK"}}
					for _, i := range imgs {
						rows = append(rows, []string{i.Name, i.Kind, humanBytes(i.SizeBytes), i.Created.Local().Format("2006-01-02 15:04"), i.Disk})
					}
					return writeTable(stdio.Out, rows)
				}),
			},
		},
	}
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
