"""The Deployment of one pool (main or long-context) of one service at one model version."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import Any

from glm_operator.planning.planner import Plan
from glm_operator.render.cache_node import rolling_update
from glm_operator.render.environment import render_object
from glm_operator.render.meta import object_meta
from glm_operator.render.names import common_labels, dns_name, pool_selector
from glm_operator.render.pod import PoolContext, pod_spec, startup_seconds
from glm_operator.wellknown import INITIAL_REPLICAS_ANNOTATION as INITIAL_REPLICAS_ANNOTATION
from glm_operator.wellknown import LONG_CONTEXT_POOL as LONG_CONTEXT_POOL
from glm_operator.wellknown import MAIN_POOL as MAIN_POOL
from glm_operator.wellknown import PLAN_HASH_ANNOTATION

ENGINE_COMPONENT = "engine"


def deployment_name(service: str, version: str, pool: str) -> str:
    return dns_name(service, version, "lc" if pool == LONG_CONTEXT_POOL else "")


def plan_hash(plan: Plan) -> str:
    """Short hash of what the plan decides; a new plan rolls the pods (and says so)."""
    llamacpp = asdict(plan.llamacpp) if plan.llamacpp else None
    vllm = asdict(plan.vllm) if plan.vllm else None
    decided: dict[str, Any] = {
        "engine": plan.request.engine,
        "profile": plan.profile.name,
        "count": plan.request.count,
        "llamacpp": llamacpp,
        "vllm": vllm,
        "resources": asdict(plan.resources),
    }
    # Multi-node settings count only where they are used: a single-node plan hashes as it
    # did before they existed, so upgrading the operator restarts no pod.
    if plan.request.nodes > 1:
        decided["nodes"] = plan.request.nodes
    else:
        if llamacpp is not None:
            del llamacpp["rpc_workers"]
        if vllm is not None:
            del vllm["pipeline_parallel_size"]
    # Likewise CPU offload, which only spec.cpuOffload turns on, the host KV tier, which only
    # spec.engine.vllm.kvOffloadGiB does, and MTP, which a model without nextn layers never gets.
    if vllm is not None:
        for off_by_default in ("cpu_offload_gb", "speculative_tokens", "kv_offloading_size",
                               "kv_offload_tokens"):
            if not vllm[off_by_default]:
                del vllm[off_by_default]
        # And the layout (issue 38): a plain tensor-parallel plan hashes as before it.
        if vllm["layout"] == "tp":
            for default in ("layout", "data_parallel_size", "enable_expert_parallel",
                            "decode_context_parallel_size"):
                del vllm[default]
    return hashlib.sha256(json.dumps(decided, sort_keys=True).encode()).hexdigest()[:16]


def pool_labels(ctx: PoolContext) -> dict[str, str]:
    labels = common_labels(ctx.service_name, ENGINE_COMPONENT)
    labels.update(pool_selector(ctx.service_name, ctx.version, ctx.pool))
    return labels


def desired_replicas(ctx: PoolContext) -> tuple[int | None, int]:
    """(replicas in the intent or None, replicas to create with)."""
    if ctx.replicas is not None:
        return ctx.replicas.fixed, ctx.replicas.initial
    spec = ctx.service.spec
    if ctx.pool == LONG_CONTEXT_POOL:
        assert spec.long_context is not None
        return None, spec.long_context.min_replicas
    if spec.autoscaling is not None:
        # Scale from zero (minReplicas 0) still starts with a pod: the first version must
        # load and become Ready to be promoted; the idle clock then puts it to sleep.
        return None, max(1, spec.autoscaling.min_replicas)
    return spec.effective_replicas, spec.effective_replicas


def build_deployment(ctx: PoolContext, owner: dict[str, Any] | None) -> dict[str, Any]:
    labels = pool_labels(ctx)
    replicas, initial = desired_replicas(ctx)
    annotations = {INITIAL_REPLICAS_ANNOTATION: str(initial)} if replicas is None else None
    pod_labels = dict(labels)
    overrides = ctx.service.spec.pod_overrides
    pod_annotations: dict[str, str] = {}
    if overrides is not None:
        pod_labels.update(overrides.labels or {})
        pod_annotations.update(overrides.annotations or {})
    pod_annotations[PLAN_HASH_ANNOTATION] = plan_hash(ctx.plan)
    return render_object(
        "deployment.yaml.j2",
        metadata=object_meta(
            deployment_name(ctx.service_name, ctx.version, ctx.pool), ctx.namespace, labels,
            owner, annotations,
        ),
        replicas=replicas,
        # The rollout waits for a slow model load before calling the Deployment stuck.
        progress_deadline_seconds=startup_seconds(ctx) + 600,
        selector=pool_selector(ctx.service_name, ctx.version, ctx.pool),
        # In place (no surge) where a ReadWriteOnce cache's one node has no room for a surge.
        rolling_update=rolling_update(ctx.service, ctx.model_version, ctx.plan),
        pod_labels=pod_labels,
        pod_annotations=pod_annotations,
        pod_spec=pod_spec(ctx),
    )
