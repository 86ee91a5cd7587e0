{{/* Labels of every object: those of the kustomize base, and Helm's own. */}}
{{- define "gpuscaler.labels" -}}
app.kubernetes.io/name: gpuscaler
app.kubernetes.io/part-of: gpuscaler
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The release label kube-prometheus-stack selects on, when set. */}}
{{- define "gpuscaler.releaseLabel" -}}
{{- with .Values.monitoring.releaseLabel }}
release: {{ . }}
{{- end -}}
{{- end -}}

{{/* The config file: the shipped one (deploy/config.yaml), `config` merged over it, then
the dry run, the Prometheus URL and the device plugin's ConfigMap from their own values. */}}
{{- define "gpuscaler.config" -}}
{{- $config := mustMergeOverwrite (fromYaml (.Files.Get "files/gpuscaler.yaml")) (deepCopy .Values.config) -}}
{{- $control := get $config "control" | default dict -}}
{{- $_ := set $control "dry_run" .Values.dryRun -}}
{{- $prometheus := get $config "prometheus" | default dict -}}
{{- $_ = set $prometheus "url" .Values.prometheus.url -}}
{{- $kubernetes := get $config "kubernetes" | default dict -}}
{{- $plugin := dict "namespace" .Values.devicePlugin.namespace "name" .Values.devicePlugin.configMap -}}
{{- $_ = set $kubernetes "device_plugin_config_map" $plugin -}}
{{- $dra := get $kubernetes "dra" | default dict -}}
{{- $_ = set $dra "enabled" .Values.dra.enabled -}}
{{- $_ = set $kubernetes "dra" $dra -}}
{{- $_ = set $config "control" $control -}}
{{- $_ = set $config "prometheus" $prometheus -}}
{{- $_ = set $config "kubernetes" $kubernetes -}}
{{- toYaml $config -}}
{{- end -}}

{{/* Labels of the node agent's objects: those of deploy/agent, and Helm's own. */}}
{{- define "gpuscaler.agentLabels" -}}
app.kubernetes.io/name: gpuscaler-agent
app.kubernetes.io/part-of: gpuscaler
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Labels of the scheduler's objects: those of deploy/scheduler, and Helm's own. */}}
{{- define "gpuscaler.schedulerLabels" -}}
app.kubernetes.io/part-of: gpuscaler
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
