{{/* The labels of every object. */}}
{{- define "bdnvol-csi.labels" -}}
app.kubernetes.io/name: bdnvol-csi
{{- end }}

{{/* The plugin's directory under the kubelet's. */}}
{{- define "bdnvol-csi.pluginDir" -}}
{{ .Values.kubeletDir }}/plugins/csi.bdnvol.dev
{{- end }}

{{/* Whether the ServiceMonitor (and its Service) are rendered: not when
the metrics listen on another address than the pod's (metrics.host). */}}
{{- define "bdnvol-csi.serviceMonitor" -}}
{{- if and (ne (int .Values.metrics.port) 0) (not .Values.metrics.host) .Values.metrics.serviceMonitor.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") -}}
true
{{- end -}}
{{- end }}

{{/* The fd holder's socket, as the mounter and the holder see it: in the
plugin's state directory (stateHostPath/csi on the node). */}}
{{- define "bdnvol-csi.fdHolderSocket" -}}
/var/lib/bdnvol/csi/fdholder.sock
{{- end }}
