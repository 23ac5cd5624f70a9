package e2e

import "testing"

// TestConcurrentPushesSameTagOCILayout is TestConcurrentPushesSameTag for an
// OCI image layout, where both pushes rewrite index.json.
func TestConcurrentPushesSameTagOCILayout(t *testing.T) {
	testConcurrentPushes(t, target{name: "oci-layout", root: t.TempDir()})
}
