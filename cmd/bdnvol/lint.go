package main

import (
	"context"
	"fmt"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/pkg/deploy"
)

// LintCmd reports volume references that are not pinned, do not resolve, or
// whose tag has moved since they were pinned.
type LintCmd struct {
	Files []string `arg:"" type:"path" help:"YAML or JSON files: bdnvol.yaml, Kubernetes manifests, Helm values."`
	All   bool     `help:"Check every string that names a bdnvol volume, not only source: values and bdnvol CSI volume refs."`
	JSON  bool     `name:"json" help:"Print the findings as a JSON array."`
}

// Run lints the files; it fails when there is any finding.
func (c *LintCmd) Run(ctx context.Context, g *Globals) error {
	res := newRefResolver(g)
	all := []deploy.Finding{}
	for _, file := range c.Files {
		fs, err := deploy.LintFile(ctx, file, res, deploy.LintOptions{All: c.All})
		if err != nil {
			return err
		}
		all = append(all, fs...)
	}
	if c.JSON {
		if err := g.printJSON(all); err != nil {
			return err
		}
	} else {
		for _, f := range all {
			fmt.Fprintf(g.stdout, "%s:%d: %s: %s\n", termsafe.Name(f.File), f.Line, termsafe.Name(f.Ref), termsafe.Text(f.Reason))
		}
	}
	if len(all) > 0 {
		return fmt.Errorf("%d references need attention", len(all))
	}
	return nil
}
