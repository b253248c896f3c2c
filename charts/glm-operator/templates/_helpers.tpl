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
{{- $hook := .Values.conversionWebhook -}}
{{- if or (eq (int $hook.port) (int .Values.healthPort)) (eq (int $hook.port) (int .Values.metrics.port)) -}}
{{- fail "conversionWebhook.port must differ from healthPort and metrics.port" -}}
{{- end -}}
{{- if and $hook.certManagerInjectFrom (not $hook.certSecret) -}}
{{- fail "conversionWebhook.certManagerInjectFrom needs conversionWebhook.certSecret: the Secret cert-manager writes the webhook's certificate to" -}}
{{- end -}}
{{- if and $hook.certSecret (not $hook.caBundle) (not $hook.certManagerInjectFrom) -}}
{{- fail "conversionWebhook.certSecret needs conversionWebhook.caBundle (the PEM CA that signed it) or conversionWebhook.certManagerInjectFrom: the API server must trust the webhook" -}}
{{- end -}}
{{- if and $hook.caBundle $hook.certManagerInjectFrom -}}
{{- fail "conversionWebhook.caBundle and conversionWebhook.certManagerInjectFrom exclude each other: cert-manager's cainjector writes the caBundle" -}}
{{- end -}}
{{- end -}}

{{/* The conversion webhook's Service, the Secret of its serving certificate. */}}
{{- define "glm-operator.webhookServiceName" -}}
{{- include "glm-operator.suffixed" (list . "webhook") -}}
{{- end -}}

{{- define "glm-operator.webhookSecretName" -}}
{{- default (include "glm-operator.suffixed" (list . "webhook-tls")) .Values.conversionWebhook.certSecret -}}
{{- end -}}

{{/*
The webhook's CA and serving certificate as YAML ({ca, cert, key}, PEM), when the chart makes
them (conversionWebhook.certSecret empty). The Secret already in the cluster is reused (helm
`lookup`), so an upgrade keeps the certificate the CRD's caBundle trusts; otherwise a new CA
and a certificate for <service>.<namespace>.svc are generated. Memoized on .Release: the
Secret and the CRD's caBundle are rendered from the same pair in one render. Without a
cluster (`helm template`, `--dry-run=client`) lookup finds nothing and every render
generates a new pair.
*/}}
{{- define "glm-operator.webhookCert" -}}
{{- if not (hasKey $.Release "glmOperatorWebhookCert") -}}
{{- $secret := lookup "v1" "Secret" $.Release.Namespace (include "glm-operator.webhookSecretName" $) -}}
{{- $data := dig "data" (dict) ($secret | default (dict)) -}}
{{- $pair := dict -}}
{{- if and (hasKey $data "ca.crt") (hasKey $data "tls.crt") (hasKey $data "tls.key") -}}
{{- $pair = dict "ca" (get $data "ca.crt" | b64dec) "cert" (get $data "tls.crt" | b64dec) "key" (get $data "tls.key" | b64dec) -}}
{{- else -}}
{{- $service := include "glm-operator.webhookServiceName" $ -}}
{{- $days := int $.Values.conversionWebhook.certValidityDays -}}
{{- $ca := genCA (printf "%s-ca" $service) $days -}}
{{- $names := list $service (printf "%s.%s" $service $.Release.Namespace) (printf "%s.%s.svc" $service $.Release.Namespace) -}}
{{- $cert := genSignedCert (printf "%s.%s.svc" $service $.Release.Namespace) nil $names $days $ca -}}
{{- $pair = dict "ca" $ca.Cert "cert" $cert.Cert "key" $cert.Key -}}
{{- end -}}
{{- $_ := set $.Release "glmOperatorWebhookCert" $pair -}}
{{- end -}}
{{- get $.Release "glmOperatorWebhookCert" | toYaml -}}
{{- end -}}

{{/* The base64 CA bundle the API server verifies the webhook with; empty when cert-manager injects it. */}}
{{- define "glm-operator.webhookCABundle" -}}
{{- $hook := .Values.conversionWebhook -}}
{{- if $hook.certSecret -}}
{{- $hook.caBundle | b64enc -}}
{{- else -}}
{{- include "glm-operator.webhookCert" . | fromYaml | dig "ca" "" | b64enc -}}
{{- end -}}
{{- end -}}
