package e2e

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// serviceMonitor is the part of the Prometheus operator's ServiceMonitor the
// chart writes (k8s.io/api has no type for it); decoding is strict.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}
