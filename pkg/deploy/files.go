package deploy

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/bdnvol/bdnvol/internal/atomicfile"
)

// PinFile pins the references of the YAML or JSON file (see Pin) and, when
// write is set and something changed, replaces the file whole, keeping its
// permission bits. It returns the changes and the references it could not
// pin; an error is any other failure.
func PinFile(ctx context.Context, file string, res Resolver, opt PinOptions, write bool) ([]Change, []*RefError, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, err
	}
	out, changes, err := Pin(ctx, b, res, opt)
	var refErrs []*RefError
	if err != nil {
		if refErrs = RefErrors(err); refErrs == nil {
			return nil, nil, fmt.Errorf("%s: %w", file, err)
		}
	}
	if write && len(changes) > 0 {
		st, err := os.Stat(file)
		if err != nil {
			return changes, refErrs, err
		}
		if err := atomicfile.WriteFile(file, out, st.Mode().Perm()); err != nil {
			return changes, refErrs, err
		}
	}
	return changes, refErrs, nil
}

// RefErrors returns the *RefError parts of err (one, or joined), or nil if
// err has any other part.
func RefErrors(err error) []*RefError {
	parts := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		parts = j.Unwrap()
	}
	var out []*RefError
	for _, p := range parts {
		var re *RefError
		if !errors.As(p, &re) {
			return nil
		}
		out = append(out, re)
	}
	return out
}

// LintFile lints the YAML or JSON file (see Lint); each finding names it.
func LintFile(ctx context.Context, file string, res Resolver, opt LintOptions) ([]Finding, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	fs, err := Lint(ctx, b, res, opt)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	for i := range fs {
		fs[i].File = file
	}
	return fs, nil
}
