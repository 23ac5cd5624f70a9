package main

import (
	"context"
	"fmt"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/pkg/deploy"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// PinCmd rewrites tag references into digest-pinned ones in place.
type PinCmd struct {
	Files  []string `arg:"" type:"path" help:"YAML or JSON files: bdnvol.yaml, Kubernetes manifests, Helm values."`
	All    bool     `help:"Pin every string that resolves to a bdnvol volume, not only source: values and bdnvol CSI volume refs."`
	Check  bool     `help:"Print the changes without writing."`
	Update bool     `help:"Also re-pin references whose tag has moved since they were pinned."`
}

// Run pins the files.
func (c *PinCmd) Run(ctx context.Context, g *Globals) error {
	res := newRefResolver(g)
	failed := 0
	for _, file := range c.Files {
		changes, refErrs, err := deploy.PinFile(ctx, file, res, deploy.PinOptions{All: c.All, Update: c.Update}, !c.Check)
		for _, e := range refErrs {
			fmt.Fprintf(g.stderr, "%s:%d: %s: %s\n", termsafe.Name(file), e.Line, termsafe.Name(e.Ref), termsafe.Text(fmt.Sprint(e.Err)))
			failed++
		}
		for _, ch := range changes {
			fmt.Fprintf(g.stdout, "%s:%d: %s -> %s\n", termsafe.Name(file), ch.Line, termsafe.Name(ch.Old), termsafe.Name(ch.New))
		}
		if err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d references could not be pinned", failed)
	}
	return nil
}

// newRefResolver resolves the references of pin and lint.
func newRefResolver(g *Globals) deploy.Resolver { return versions.NewResolver(g.options()) }
