package e2e

import "testing"

// TestFaultsCutBodies is TestFaults for responses cut half-way: the first
// GET of each blob loses its connection after half of Content-Length. Pull
// must succeed by retrying the chunk (and the file index).
func TestFaultsCutBodies(t *testing.T) {
	for _, fc := range []faultCase{
		{name: "cut-bodies", cfg: faultConfig{CutFirstBlobGET: true}, mustPush: true, mustPull: true},
		// A retry that resumes with Range gets the whole blob again.
		{name: "cut-bodies-no-range", cfg: faultConfig{CutFirstBlobGET: true, NoRange: true}, mustPush: true, mustPull: true},
	} {
		t.Run(fc.name, func(t *testing.T) {
			t.Parallel()
			testFault(t, fc)
		})
	}
}
