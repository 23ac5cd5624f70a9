package csi

import (
	"context"
	"errors"
	"net"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/errcode"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// Error kinds the mounter reports over its socket, named after the CSI
// codes they become.
const (
	kindInvalid     = "InvalidArgument"
	kindNotFound    = "NotFound"
	kindPermission  = "PermissionDenied"
	kindUnavailable = "Unavailable"
	kindInternal    = "Internal"
)

// kindOf classifies an error from resolving or opening a version.
func kindOf(err error) string {
	var ec *errcode.ErrorResponse
	var me *mounterError
	var ke *kindError
	switch {
	case errors.As(err, &me):
		return me.Kind
	case errors.As(err, &ke):
		return ke.kind
	case errors.Is(err, auth.ErrBasicCredentialNotFound):
		return kindPermission
	case errors.Is(err, oci.ErrMismatchedDigest):
		// The registry named did not serve the manifest of the digest:
		// these credentials did not read that version from there.
		return kindPermission
	case errors.Is(err, layout.ErrNotVolume), errors.Is(err, oci.ErrManifestTooLarge):
		return kindInvalid
	case errors.Is(err, errdef.ErrNotFound), errors.Is(err, oci.ErrNotFound):
		return kindNotFound
	case errors.As(err, &ec):
		switch ec.StatusCode {
		case 401, 403:
			return kindPermission
		case 404:
			return kindNotFound
		case 429, 500, 502, 503, 504:
			return kindUnavailable
		}
		return kindInternal
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EHOSTUNREACH):
		return kindUnavailable
	}
	var ne net.Error
	var oe *net.OpError
	if errors.As(err, &oe) || errors.As(err, &ne) {
		return kindUnavailable
	}
	return kindInternal
}

// codeOf turns a kind into its gRPC code.
func codeOf(kind string) codes.Code {
	switch kind {
	case kindInvalid:
		return codes.InvalidArgument
	case kindNotFound:
		return codes.NotFound
	case kindPermission:
		return codes.PermissionDenied
	case kindUnavailable:
		return codes.Unavailable
	}
	return codes.Internal
}

// statusOf is err as a gRPC status whose code follows its kind.
func statusOf(err error) error {
	return status.Error(codeOf(kindOf(err)), err.Error())
}
