"""Whether a version's pods can share its cache volume (pure): ReadWriteOnce is one node.

A ReadWriteOnce claim is mounted by one node at a time. The render pins every pod serving
the version to the node whose pods already use it (required pod affinity on
kubernetes.io/hostname, render/pod.py `cache_affinity`); what cannot be placed that way is
refused here as Planned=False, reason CacheNotShareable, before any pod is created, instead
of pods waiting in Multi-Attach without a word:

- a multi-node replica (accelerator.nodes above 1): its workers run on other nodes by
  definition, so they could never mount the weights;
- more devices than one node has: every replica (the main pool's and the long-context
  pool's, at the most the spec lets them scale to) lands on that one node.

ReadWriteMany (or ReadOnlyMany) is the multi-node choice: nothing is pinned then.
"""

from __future__ import annotations

from glm_operator.api import GLMService, ModelVersion
from glm_operator.planning.planner import Plan

READ_WRITE_ONCE = "ReadWriteOnce"
REASON = "CacheNotShareable"
_FIX = ("create a ModelVersion with spec.cache.accessMode ReadWriteMany (a StorageClass that "
        "offers it, e.g. NFS, CephFS, a cloud file store) and point spec.modelVersion at it")


def pins_to_one_node(model_version: ModelVersion) -> bool:
    return model_version.spec.cache.access_mode == READ_WRITE_ONCE


def _most_replicas(service: GLMService) -> tuple[int, str]:
    autoscaling = service.spec.autoscaling
    if autoscaling is not None:
        return autoscaling.max_replicas, f"autoscaling.maxReplicas {autoscaling.max_replicas}"
    replicas = service.spec.effective_replicas
    return replicas, f"{replicas} replica{'s' if replicas != 1 else ''}"


def cache_placement_problem(service: GLMService, model_version: ModelVersion, main: Plan,
                            long_context: Plan | None) -> tuple[str, str] | None:
    """(reason, message) when the version's pods cannot all sit on the one node that mounts
    its ReadWriteOnce cache; None when they can, or the cache is shared."""
    if not pins_to_one_node(model_version):
        return None
    name = model_version.metadata.name
    claim = f"ModelVersion {name!r} caches its weights on a ReadWriteOnce volume"
    for pool, plan in (("main", main), ("long-context", long_context)):
        if plan is not None and plan.request.nodes > 1:
            return (REASON, f"{claim}, which one node mounts, but the {pool} pool's replica "
                    f"spans {plan.request.nodes} nodes (accelerator.nodes): its workers on the "
                    f"other nodes could never mount it; {_FIX}")
    profile = main.profile
    if profile.resource_name is None:  # cpu: placed by CPU and memory, no device to count
        return None
    replicas, which = _most_replicas(service)
    needed = replicas * main.request.count
    parts = [f"{which} x {main.request.count} {profile.resource_name}"]
    lc_spec = service.spec.long_context
    others = 0  # the long-context pool's devices on the same node
    if (long_context is not None and lc_spec is not None and lc_spec.enabled
            and long_context.profile.resource_name == profile.resource_name):
        others = lc_spec.max_replicas * long_context.request.count
        parts.append(f"longContext.maxReplicas {lc_spec.max_replicas} x "
                     f"{long_context.request.count}")
    needed = replicas * main.request.count + others
    capacity = profile.max_devices_per_node
    if needed <= capacity:
        return None
    fits = (capacity - others) // main.request.count
    lower = (f"at most {fits} replica{'s' if fits != 1 else ''} fit" if fits >= 1
             else "not one main replica fits beside the long-context pool")
    return (REASON, f"{claim}, so every pod serving it runs on the node that mounts it: "
            f"{' + '.join(parts)} = {needed} {profile.resource_name} on one node, but a "
            f"{profile.name} node has {capacity} ({lower}); lower the replicas, or {_FIX}")
