package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/bdnvol/bdnvol/internal/atomicfile"
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
		b, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		out, changes, err := deploy.Pin(ctx, b, res, deploy.PinOptions{All: c.All, Update: c.Update})
		var refErrs []*deploy.RefError
		if err != nil {
			if refErrs = refErrors(err); refErrs == nil {
				return fmt.Errorf("%s: %w", file, err)
			}
		}
		for _, e := range refErrs {
			fmt.Fprintf(g.stderr, "%s:%d: %s: %s\n", termsafe.Name(file), e.Line, termsafe.Name(e.Ref), termsafe.Text(fmt.Sprint(e.Err)))
			failed++
		}
		for _, ch := range changes {
			fmt.Fprintf(g.stdout, "%s:%d: %s -> %s\n", termsafe.Name(file), ch.Line, termsafe.Name(ch.Old), termsafe.Name(ch.New))
		}
		if c.Check || len(changes) == 0 {
			continue
		}
		if err := writeFileAtomic(file, out); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d references could not be pinned", failed)
	}
	return nil
}

// refErrors returns the *deploy.RefError parts of err, or nil if err has
// any other part.
func refErrors(err error) []*deploy.RefError {
	parts := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		parts = j.Unwrap()
	}
	var out []*deploy.RefError
	for _, p := range parts {
		var re *deploy.RefError
		if !errors.As(p, &re) {
			return nil
		}
		out = append(out, re)
	}
	return out
}

// writeFileAtomic replaces file with b, keeping its permission bits.
func writeFileAtomic(file string, b []byte) error {
	st, err := os.Stat(file)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(file, b, st.Mode().Perm())
}

// newRefResolver resolves the references of pin and lint.
func newRefResolver(g *Globals) deploy.Resolver { return versions.NewResolver(g.options()) }
