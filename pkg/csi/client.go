package csi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
)

// MounterClient talks to a Mounter over its unix socket.
type MounterClient struct {
	socket string
	hc     *http.Client
}

// NewMounterClient returns a client of the mounter listening at socket.
func NewMounterClient(socket string) *MounterClient {
	socket = strings.TrimPrefix(socket, "unix://")
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	return &MounterClient{socket: socket, hc: &http.Client{Transport: tr}}
}

// mounterError is a failure the mounter reported, with its kind.
type mounterError struct{ apiError }

func (e *mounterError) Error() string { return e.Message }

func (c *MounterClient) call(ctx context.Context, method, path string, in, out any) error {
	var body bytes.Buffer
	if in != nil {
		if err := json.NewEncoder(&body).Encode(in); err != nil {
			return err
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://mounter"+path, &body)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return &mounterError{apiError{Kind: kindUnavailable, Message: fmt.Sprintf("mounter at %s: %v", c.socket, err)}}
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var ae apiError
		if err := json.NewDecoder(resp.Body).Decode(&ae); err != nil || ae.Kind == "" {
			return &mounterError{apiError{Kind: kindInternal, Message: fmt.Sprintf("mounter at %s: %s", c.socket, resp.Status)}}
		}
		return &mounterError{ae}
	}
	if out != nil {
		return json.NewDecoder(resp.Body).Decode(out)
	}
	return nil
}

// Mount asks for the mount of the digest that ref pins.
func (c *MounterClient) Mount(ctx context.Context, req mountRequest) (MountInfo, error) {
	var info MountInfo
	err := c.call(ctx, http.MethodPost, "/v1/mount", req, &info)
	return info, err
}

// Unmount asks the mounter to unmount the version with mount key key
// (REGISTRY/REPOSITORY@DIGEST, see MountKey).
func (c *MounterClient) Unmount(ctx context.Context, key string) error {
	req := unmountRequest{Ref: key}
	if _, d, ok := strings.Cut(key, "@"); ok {
		req.Digest = d // an older mounter reads only this
	}
	return c.call(ctx, http.MethodPost, "/v1/unmount", req, nil)
}

// List returns the mounts the mounter serves.
func (c *MounterClient) List(ctx context.Context) ([]MountInfo, error) {
	var out []MountInfo
	err := c.call(ctx, http.MethodGet, "/v1/mounts", nil, &out)
	return out, err
}
