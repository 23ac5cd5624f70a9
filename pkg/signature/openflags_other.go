//go:build !unix

package signature

// openFlags are none where FIFOs and terminals are not opened as files.
const openFlags = 0
