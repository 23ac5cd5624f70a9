package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/pkg/imageview"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

func TestParsePlatform(t *testing.T) {
	if o, a, err := parsePlatform("linux/arm64"); err != nil || o != "linux" || a != "arm64" {
		t.Errorf("linux/arm64: %q %q %v", o, a, err)
	}
	for _, s := range []string{"", "linux", "linux/", "/amd64", "linux/arm/v7"} {
		if _, _, err := parsePlatform(s); !errors.Is(err, errPlatform) || !strings.Contains(err.Error(), `"`+s+`"`) {
			t.Errorf("%q: %v, want errPlatform naming it", s, err)
		}
	}
}

func TestParseImageDestination(t *testing.T) {
	if r, err := parseImageDestination(""); err != nil || r != (oci.Ref{}) {
		t.Errorf("empty: %+v, %v", r, err)
	}
	if r, err := parseImageDestination("reg.example/img:v1"); err != nil || r.Tag != "v1" {
		t.Errorf("tagged: %+v, %v", r, err)
	}
	d := "reg.example/img@sha256:" + strings.Repeat("a", 64)
	if _, err := parseImageDestination(d); !errors.Is(err, imageview.ErrDestinationDigest) || !strings.Contains(err.Error(), d) {
		t.Errorf("digest: %v, want ErrDestinationDigest naming it", err)
	}
	if _, err := parseImageDestination("Not A Ref"); err == nil {
		t.Error("bad reference accepted")
	}
}
