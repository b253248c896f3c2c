{{/* Names: every generated name fits in 63 characters (a DNS label). */}}

{{- define "glm-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "glm-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "<fullname>-<suffix>", the full name shortened so the whole stays within 63. */}}
{{- define "glm-operator.suffixed" -}}
{{- $root := index . 0 -}}
{{- $suffix := index . 1 -}}
{{- $base := include "glm-operator.fullname" $root | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" -}}
{{- printf "%s-%s" $base $suffix -}}
{{- end -}}

{{- define "glm-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "glm-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "glm-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "glm-operator.labels" -}}
helm.sh/chart: {{ include "glm-operator.chart" . }}
{{ include "glm-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: glm-operator
{{- end -}}

{{- define "glm-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "glm-operator.fullname" .) .Values.serviceAccount.name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "glm-operator.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag -}}
{{- end -}}

{{- define "glm-operator.image" -}}
{{- printf "%s/glm-operator:%s" (trimSuffix "/" .Values.image.registry) (include "glm-operator.imageTag" .) -}}
{{- end -}}

{{- define "glm-operator.leaseName" -}}
{{- default (include "glm-operator.fullname" .) .Values.leaderElection.leaseName -}}
{{- end -}}

{{/*
Cluster-wide unless every watched namespace is an exact name: no namespaces means all of
them, and a glob matches namespaces that may not exist yet (no Role can be made for those).
*/}}
{{- define "glm-operator.clusterWide" -}}
{{- $cluster := not .Values.watchNamespaces -}}
{{- range .Values.watchNamespaces -}}
{{- if regexMatch "[*?\\[\\]!,]" . -}}{{- $cluster = true -}}{{- end -}}
{{- end -}}
{{- if $cluster }}true{{ end -}}
{{- end -}}

{{/*
The operator's configuration file: the image from `image`, then every `config` key that is
set (null scalars and empty sections keep the operator's defaults).
*/}}
{{- define "glm-operator.config" -}}
{{- $config := dict "imageRegistry" (trimSuffix "/" .Values.image.registry) "imageTag" (include "glm-operator.imageTag" .) -}}
{{- with .Values.image.epp -}}
{{- $_ := set $config "eppImage" . -}}
{{- end -}}
{{- range $key, $value := .Values.config -}}
{{- if not (or (kindIs "invalid" $value) (and (kindIs "map" $value) (empty $value))) -}}
{{- $_ := set $config $key $value -}}
{{- end -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{- define "glm-operator.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) -}}
{{- fail "replicaCount > 1 needs leaderElection.enabled: two operators reconciling the same objects fight over them" -}}
{{- end -}}
{{- $le := .Values.leaderElection -}}
{{- if not (and (lt (float64 $le.retryPeriodSeconds) (float64 $le.renewDeadlineSeconds)) (lt (float64 $le.renewDeadlineSeconds) (float64 $le.leaseDurationSeconds))) -}}
{{- fail "leaderElection needs retryPeriodSeconds < renewDeadlineSeconds < leaseDurationSeconds: the leader must give up before a follower may take over" -}}
{{- end -}}
{{- if eq .Values.healthPort .Values.metrics.port -}}
{{- fail "healthPort and metrics.port must differ" -}}
{{- end -}}
{{- end -}}
