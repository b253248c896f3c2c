{{/*
The operator's permissions, listed once. Derived from the code (docs/install.md has the
table): what the kopf handlers and indexes watch (controllers/indexes.py, controllers/triggers.py), what kube/client.py
writes (server-side apply = patch, create, delete), what kopf itself needs, and what the
operator hands out in the Roles it renders (render/rbac.py): Kubernetes lets it grant only
what it holds, so those verbs are here too. tests/chart pins every rule; no wildcards.
Secrets: list and watch only, for their names (rbac.watchSecrets): the operator asks for
PartialObjectMetadata and never reads a Secret's data (API-key and credential Secrets are
mounted into the model and fetch pods by name); it never gets, writes or deletes one.
*/}}

{{/* In every watched namespace (a ClusterRole when cluster-wide). */}}
{{- define "glm-operator.rules.namespaced" -}}
# GLMServices: watched (kopf index and handlers), annotated by kopf's bookkeeping.
- apiGroups: [serving.glm-operator.dev]
  resources: [glmservices]
  verbs: [list, watch, patch]
- apiGroups: [serving.glm-operator.dev]
  resources: [glmservices/status]
  verbs: [patch]
# ModelVersions: as GLMServices; get is handed to the fetch Job's Role.
- apiGroups: [serving.glm-operator.dev]
  resources: [modelversions]
  verbs: [get, list, watch, patch]
# The operator patches status; the fetch Job's Role gets get, patch and update.
- apiGroups: [serving.glm-operator.dev]
  resources: [modelversions/status]
  verbs: [get, patch, update]
# The children of GLMServices and ModelVersions: indexed (list, watch), applied (patch;
# create for the first replicas of autoscaled pools), pruned (delete).
- apiGroups: [apps]
  resources: [deployments, statefulsets]
  verbs: [list, watch, create, patch, delete]
# Handed to the router's Role (spec.routing EndpointPicker: it reads the versions'
# Deployments it wakes).
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list, watch, create, patch, delete]
# Handed to the gateway's Role (it wakes its long-context pool) and the router's (it wakes
# a version scaled to zero).
- apiGroups: [apps]
  resources: [deployments/scale]
  verbs: [get, patch, update]
- apiGroups: [""]
  resources: [services, serviceaccounts, persistentvolumeclaims]
  verbs: [list, watch, create, patch, delete]
# The route table and the endpoint picker's config of spec.routing EndpointPicker: children
# like the others; get, list and watch of its own route table are handed to the router.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, patch, delete]
# Handed to the endpoint picker's and the router's Roles: both watch the engine pods. The
# operator itself never reads a pod.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [list, watch, create, patch, delete]
# One PodDisruptionBudget per pool of a GLMService.
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [list, watch, create, patch, delete]
# Optional children (their CRDs may come and go): read when the intent changed and at every
# resync, never watched; list: once per service and kind after a start, to prune one the
# previous operator process left behind (a switch it did not see).
- apiGroups: [monitoring.coreos.com]
  resources: [servicemonitors]
  verbs: [get, list, create, patch, delete]
# The activity Leases (the long-context pool's, a scaled-from-zero main pool's): applied,
# read when an idle deadline passes, never watched; patch is handed to the gateways' Roles
# (they renew it), update and patch to the router's.
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, list, create, update, patch, delete]
# Multi-node groups as LeaderWorkerSets (when LeaderWorkerSet is installed).
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, list, create, patch, delete]
# Canary traffic split (when Istio is installed).
- apiGroups: [networking.istio.io]
  resources: [virtualservices, destinationrules]
  verbs: [get, list, create, patch, delete]
# What an inference gateway reads (spec.routing.mode InferenceGateway, when the Inference
# Extension's and Gateway API's CRDs are installed): a pool per version, listed at every
# reconcile for its status (the gateway's answer), and the HTTPRoute. get, list and watch of
# the pools, InferenceObjectives and InferenceModelRewrites are handed to each pool's
# endpoint picker (it watches the last two where their CRDs are served).
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [gateway.networking.k8s.io]
  resources: [httproutes]
  verbs: [get, list, create, patch, delete]
- apiGroups: [inference.networking.x-k8s.io]
  resources: [inferenceobjectives, inferencemodelrewrites]
  verbs: [get, list, watch]
# The main pool's KEDA ScaledObject (when KEDA is installed); list: once per service after a
# start, to prune one a scaler switch or a rollout left behind.
- apiGroups: [keda.sh]
  resources: [scaledobjects]
  verbs: [get, list, create, patch, delete]
# Events on GLMServices and ModelVersions (kopf posts them; repeats are patched).
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
{{- if .Values.rbac.watchSecrets }}
# Secret names, to say when a GLMService names a missing one (controllers/secrets.py asks
# for metadata only; RBAC has no narrower verb than list/watch).
- apiGroups: [""]
  resources: [secrets]
  verbs: [list, watch]
{{- end }}
{{- end -}}

{{/* Cluster-scoped reads, in every mode. */}}
{{- define "glm-operator.rules.cluster" -}}
# kopf follows CRDs (list, watch) to start watching kinds installed later; the operator
# reads the Istio, ServiceMonitor and KEDA ScaledObject CRDs' state (get).
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
{{- if not (include "glm-operator.clusterWide" .) }}
# Watching namespaces by exact name: kopf lists and watches namespaces to find them. Refused,
# it retries for about a minute before it starts watching anything. (Globs watch
# cluster-wide and filter in the operator, which needs no namespace listing.)
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
{{- end -}}

{{/* In the release namespace: the leader-election Lease, and only that one. */}}
{{- define "glm-operator.rules.leaderElection" -}}
# create cannot be limited to a name (the name is not known when it is authorized).
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [create]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  resourceNames: [{{ include "glm-operator.leaseName" . | quote }}]
  verbs: [get, patch]
{{- end -}}
