// Package helmchart renders bdnvol's Helm chart with Helm's own engine,
// for the chart tests and for the generator of deploy/kubernetes.
package helmchart

import (
	"fmt"
	"path"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	"sigs.k8s.io/yaml"
)

// Release is the release name the plain manifests are rendered as.
const Release = "bdnvol-csi"

// Render renders the chart in dir into namespace, with values (YAML) over
// the chart's defaults and the API versions extra added to the default
// capabilities. It returns each template's output by its name
// (CHART/templates/FILE).
func Render(dir, namespace, values string, extra ...string) (map[string]string, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	vals := map[string]any{}
	if err := yaml.Unmarshal([]byte(values), &vals); err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	caps := *common.DefaultCapabilities
	caps.APIVersions = append(append(common.VersionSet{}, caps.APIVersions...), extra...)
	top, err := util.ToRenderValues(ch, vals, common.ReleaseOptions{Name: Release, Namespace: namespace, IsInstall: true}, &caps)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	out, err := engine.Render(ch, top)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	return out, nil
}

// plainNames maps a template to the file of deploy/kubernetes it is
// written to, where the names differ.
var plainNames = map[string]string{"configmaps.yaml": "warm-list.yaml"}

// Manifests renders the chart in dir with its default values into
// kube-system, as deploy/kubernetes holds it: the contents of each file by
// its name there. Templates that render nothing (the ServiceMonitor by
// default) give no file.
func Manifests(dir string) (map[string][]byte, error) {
	out, err := Render(dir, "kube-system", "")
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{}
	for name, text := range out {
		base := path.Base(name)
		if path.Ext(base) != ".yaml" || strings.TrimSpace(text) == "" {
			continue
		}
		if n, ok := plainNames[base]; ok {
			base = n
		}
		files[base] = []byte(Header + strings.TrimLeft(text, "\n"))
	}
	return files, nil
}

// Header starts every generated manifest.
const Header = "# Generated from deploy/helm/bdnvol-csi by `make deploy-manifests`: edit the chart, not this file.\n"
