// Command manifests writes deploy/kubernetes from the Helm chart
// (deploy/helm/bdnvol-csi) rendered with its default values into
// kube-system: the chart is the one source of the deployment, and the plain
// manifests are its output (make deploy-manifests). With -check it writes
// nothing and fails when a file differs from what the chart renders.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/bdnvol/bdnvol/e2e/helmchart"
)

func main() {
	chart := flag.String("chart", "../deploy/helm/bdnvol-csi", "the chart's directory")
	out := flag.String("out", "../deploy/kubernetes", "the directory of the plain manifests")
	check := flag.Bool("check", false, "fail when a file differs instead of writing it")
	flag.Parse()
	files, err := helmchart.Manifests(*chart)
	if err != nil {
		fmt.Fprintln(os.Stderr, "manifests:", err)
		os.Exit(1)
	}
	stale := 0
	for name, b := range files {
		p := filepath.Join(*out, name)
		if *check {
			if old, err := os.ReadFile(p); err != nil || !bytes.Equal(old, b) {
				fmt.Fprintf(os.Stderr, "manifests: %s is not what the chart renders (make deploy-manifests)\n", p)
				stale++
			}
			continue
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "manifests:", err)
			os.Exit(1)
		}
	}
	if stale > 0 {
		os.Exit(1)
	}
}
