package csi

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// maxArgBytes bounds a volume id, reference or path a request names; a
// longer one is refused without being echoed in the error.
const maxArgBytes = 4096

// checkSizes refuses, with InvalidArgument, the first of the named values
// (name, value, name, value...) longer than maxArgBytes.
func checkSizes(kv ...string) error {
	for i := 0; i+1 < len(kv); i += 2 {
		if n := len(kv[i+1]); n > maxArgBytes {
			return status.Errorf(codes.InvalidArgument, "%s of %d bytes: more than %d", kv[i], n, maxArgBytes)
		}
	}
	return nil
}

// checkRequest refuses, with InvalidArgument, a request whose volume id or
// path (called pathName) is missing, or whose id, path or further named
// values (name, value, ...) are longer than maxArgBytes.
func checkRequest(volumeID, pathName, path string, more ...string) error {
	if err := checkSizes(append([]string{"volume id", volumeID, pathName, path}, more...)...); err != nil {
		return err
	}
	if volumeID == "" {
		return status.Error(codes.InvalidArgument, "volume id missing")
	}
	if path == "" {
		return status.Errorf(codes.InvalidArgument, "%s missing", pathName)
	}
	return nil
}
