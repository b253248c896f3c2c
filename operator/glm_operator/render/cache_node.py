"""The one node of a ReadWriteOnce cache: how a pinned pool rolls out (pure).

Every pod serving a version with a ReadWriteOnce cache runs on one node (render/pod.py
`cache_affinity`). A rolling update's surge pod (maxSurge 1, maxUnavailable 0, the default)
must then fit on that node beside every replica it replaces; where the node has no room for
it, it would stay Pending forever and the rollout never end. Such a pool is replaced one pod
at a time instead (maxSurge 0, maxUnavailable 1): a replica is out while its successor loads,
which no node could avoid.

The count is the spec's, at the most it lets the pools scale to, as decide/cache_placement.py
counts it when it refuses what cannot fit at all.
"""

from __future__ import annotations

from typing import Any

from glm_operator.api.glmservice import GLMService
from glm_operator.api.modelversion import ModelVersion
from glm_operator.planning.planner import Plan

SURGE = {"maxSurge": 1, "maxUnavailable": 0}
IN_PLACE = {"maxSurge": 0, "maxUnavailable": 1}


def pinned_to_one_node(model_version: ModelVersion, plan: Plan) -> bool:
    return model_version.spec.cache.access_mode == "ReadWriteOnce" and plan.request.nodes == 1


def devices_on_the_node(service: GLMService, plan: Plan) -> int:
    """Devices the version's replicas of both pools take on the cache's node, at most."""
    spec = service.spec
    most = spec.autoscaling.max_replicas if spec.autoscaling else spec.effective_replicas
    devices = most * spec.accelerator.count
    lc = spec.long_context
    if lc is not None and lc.enabled:
        devices += lc.max_replicas * (lc.accelerator or spec.accelerator).count
    return devices


def rolling_update(service: GLMService, model_version: ModelVersion, plan: Plan) -> (
        dict[str, Any]):
    """The Deployment's rollingUpdate: a surge pod where the cache's node has room for it."""
    if (not pinned_to_one_node(model_version, plan) or plan.profile.resource_name is None):
        return dict(SURGE)
    room = plan.profile.max_devices_per_node - devices_on_the_node(service, plan)
    return dict(SURGE) if room >= plan.request.count else dict(IN_PLACE)
