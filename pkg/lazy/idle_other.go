//go:build !linux

package lazy

// idleThread does nothing where threads have no idle scheduling class.
func idleThread() error { return nil }
