"""The names every part of glm-operator agrees on: the API group and version, the label and
annotation keys it owns, and the pool names.

One home, imported by api, render, controllers, kube and the gateway alike, so that a key is
never retyped (and never drifts) between the code that writes it and the code that reads it.
Pure constants: this module imports nothing from the package.
"""

from __future__ import annotations

from typing import Final

GROUP: Final = "serving.glm-operator.dev"
VERSION: Final = "v1alpha2"
API_VERSION: Final = f"{GROUP}/{VERSION}"
# What v1alpha2 cannot hold of a v1alpha1 object, kept by conversion (api/conversion.py).
CONVERSION_STASH_ANNOTATION: Final = f"{GROUP}/v1alpha1-fields"

# Label and annotation keys on every child the operator writes.
PREFIX: Final = "glm-operator.dev"
SERVICE_LABEL: Final = f"{PREFIX}/service"
VERSION_LABEL: Final = f"{PREFIX}/version"
POOL_LABEL: Final = f"{PREFIX}/pool"
MODEL_VERSION_LABEL: Final = f"{PREFIX}/model-version"  # children of a ModelVersion
# On an InferencePool's endpoint picker: the pool it serves (spec.routing.mode InferenceGateway).
INFERENCE_POOL_LABEL: Final = f"{PREFIX}/inference-pool"
COMPONENT_LABEL: Final = "app.kubernetes.io/component"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "glm-operator"
# Label prefixes the operator owns; users cannot set them through overrides.
RESERVED_LABEL_PREFIXES: Final[tuple[str, ...]] = (f"{PREFIX}/", "app.kubernetes.io/")

# A short hash of what the plan decides; a new plan rolls the pods (and says so).
PLAN_HASH_ANNOTATION: Final = f"{PREFIX}/plan-hash"
# Set where `replicas` is left out of the intent (an HPA or the gateway's wake-up owns it):
# the replicas to create the Deployment with. Applying without `replicas` would create 1.
INITIAL_REPLICAS_ANNOTATION: Final = f"{PREFIX}/initial-replicas"
# A hash of the whole applied intent: a field removed from the intent changes it, so the
# object is applied again and the API server drops what the operator no longer sets.
INTENT_HASH_ANNOTATION: Final = f"{PREFIX}/intent-hash"
# On the endpoint picker's pod template: a hash of its config file, which it reads once, so
# a changed config rolls the pod (render/routing.py).
CONFIG_HASH_ANNOTATION: Final = f"{PREFIX}/config-hash"
# User commands on a GLMService, naming the ModelVersion they act on.
PROMOTE_ANNOTATION: Final = f"rollout.{PREFIX}/promote"
ABORT_ANNOTATION: Final = f"rollout.{PREFIX}/abort"

# The two pools of a service: the main one, and the long-context overflow pool.
MAIN_POOL: Final = "main"
LONG_CONTEXT_POOL: Final = "long-context"
POOLS: Final[tuple[str, ...]] = (MAIN_POOL, LONG_CONTEXT_POOL)
