package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"moat.dev/moat/internal/image"
)

func newImageCmd() *cobra.Command {
	c := &cobra.Command{Use: "image", Short: "Manage OCI images in moat's cache", Long: `Import, pull, list and remove the OCI images sandboxes can use as their root
filesystem ([sandbox] image). Layers are unpacked once per digest and shared.`}
	var asJSON bool
	list := &cobra.Command{
		Use: "list", Short: "List cached images", Long: `List the images in moat's cache with their size on disk.`, Args: cobra.NoArgs,
		Example: "  moat image list\n  moat image list --json",
		RunE: func(c *cobra.Command, _ []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			s, err := e.images()
			if err != nil {
				return err
			}
			imgs, err := s.List()
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(c.OutOrStdout()).Encode(map[string]any{"schema": 1, "images": imgs})
			}
			tw := tabwriter.NewWriter(c.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "REF\tDIGEST\tLAYERS")
			for _, i := range imgs {
				fmt.Fprintf(tw, "%s\t%s\t%d\n", i.Ref, i.ShortDigest(), len(i.Layers))
			}
			return tw.Flush()
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	imp := &cobra.Command{
		Use: "import ARCHIVE", Short: "Import a docker-save or OCI-layout tarball", Long: `Import an image from a docker save or OCI-layout tarball into moat's cache;
layers with paths that escape, device nodes or links out of the layer are
refused.`, Args: cobra.ExactArgs(1),
		Example: "  moat image import ./debian.tar",
		RunE: func(c *cobra.Command, args []string) error {
			return imageOp(c, func(s *image.Store) (*image.Image, error) {
				return s.Import(context.Background(), args[0], os.Stderr)
			})
		},
	}
	pull := &cobra.Command{
		Use: "pull REF", Short: "Pull an image from a registry", Long: `Pull an image from a registry into moat's cache (plain HTTP only for a
registry on loopback).`, Args: cobra.ExactArgs(1),
		Example: "  moat image pull localhost:5000/tools:latest",
		RunE: func(c *cobra.Command, args []string) error {
			return imageOp(c, func(s *image.Store) (*image.Image, error) {
				return s.Pull(context.Background(), args[0], os.Stderr)
			})
		},
	}
	rm := &cobra.Command{
		Use: "rm REF", Short: "Remove an image and the layers no other image uses", Long: `Remove an image from moat's cache, and the layers no other image uses.`, Args: cobra.ExactArgs(1),
		Example: "  moat image rm localhost:5000/tools:latest",
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			s, err := e.images()
			if err != nil {
				return err
			}
			if err := s.Remove(args[0]); err != nil {
				if errors.Is(err, image.ErrNotFound) {
					return withCode(ExitNotFound, err)
				}
				return err
			}
			return nil
		},
	}
	c.AddCommand(list, imp, pull, rm)
	return c
}

func imageOp(c *cobra.Command, op func(*image.Store) (*image.Image, error)) error {
	e, err := newEnv()
	if err != nil {
		return err
	}
	s, err := e.images()
	if err != nil {
		return err
	}
	img, err := op(s)
	if err != nil {
		if errors.Is(err, image.ErrNotFound) {
			return withCode(ExitNotFound, err)
		}
		return err
	}
	fmt.Fprintf(c.OutOrStdout(), "%s %s\n", img.Ref, img.Digest)
	return nil
}
