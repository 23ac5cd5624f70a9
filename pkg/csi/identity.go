package csi

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// identity is the CSI Identity service.
type identity struct {
	csi.UnimplementedIdentityServer
	version string
}

func (i *identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: DriverName, VendorVersion: i.version}, nil
}

// GetPluginCapabilities lists no controller: inline and pre-provisioned
// volumes need none.
func (i *identity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{}, nil
}

func (i *identity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}
