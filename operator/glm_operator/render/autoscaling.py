"""The HPA (autoscaling/v2) of a service's main pool, on per-pod gateway and device metrics.

The metric names come from the catalogue of signals (render/scaling_metrics.py), which also
generates the prometheus-adapter rules that serve them.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from glm_operator.api.glmservice import Autoscaling, Pool, ScalingRules
from glm_operator.planning.planner import Plan
from glm_operator.render.environment import render_object
from glm_operator.render.meta import object_meta
from glm_operator.render.quantity import decimal_quantity
from glm_operator.render.scaling_metrics import (
    ACCELERATOR_MEMORY_UTILIZATION,
    KV_CACHE_UTILIZATION,
    QUEUE_LENGTH,
    SIGNALS,
)

# A model pod takes minutes to load and holds scarce devices: add at most two per two
# minutes, remove one per five minutes after fifteen quiet minutes.
_DEFAULT_SCALE_UP: dict[str, Any] = {
    "stabilizationWindowSeconds": 60,
    "selectPolicy": "Max",
    "policies": [{"type": "Pods", "value": 2, "periodSeconds": 120}],
}
_DEFAULT_SCALE_DOWN: dict[str, Any] = {
    "stabilizationWindowSeconds": 900,
    "selectPolicy": "Min",
    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}],
}


def _pods_metric(name: str, average: str) -> dict[str, Any]:
    return {"type": "Pods", "pods": {
        "metric": {"name": name},
        "target": {"type": "AverageValue", "averageValue": average},
    }}


def target_values(autoscaling: Autoscaling) -> dict[str, float]:
    """The targets set, by API field name (requestsPerSecond...)."""
    return autoscaling.targets.model_dump(by_alias=True, exclude_none=True)


_GIB = 2**30

# kube-controller-manager's --horizontal-pod-autoscaler-tolerance default: the HPA changes the
# replica count only when the pods' average is more than 10 % off the target.
HPA_TOLERANCE = 0.1


def _highest_reachable_percent(tolerance: float) -> int:
    """The highest whole-percent target a share that stops at 100 % can pass by more than
    the tolerance (100 / target > 1 + tolerance): 90 with the default."""
    return math.ceil(100 / (1 + tolerance)) - 1


# A percentage target above this never scales anything up: even every pod at 100 % is within
# the tolerance of it (a KV cache target of 95 would need 104.5 %).
HIGHEST_REACHABLE_PERCENT = _highest_reachable_percent(HPA_TOLERANCE)


def _out_of_reach(field: str, target: int) -> str:
    return (f"{field} {target} % is out of the HPA's reach: the HPA adds replicas only when "
            f"the pods' average is more than {HPA_TOLERANCE:.0%} over the target "
            f"(kube-controller-manager's tolerance), and a share stops at 100 %, so a target "
            f"above {HIGHEST_REACHABLE_PERCENT} % never scales up")


@dataclass(frozen=True)
class DeviceMemoryCheck:
    """Can an acceleratorMemoryUtilization target mean anything under this plan?

    Both engines take their device memory when the model loads (llama.cpp its whole KV
    cache, vLLM --gpu-memory-utilization of the device) and hold it: device memory sits at
    the planned steady figure whatever the load. A target at or below it keeps every pod
    over target, so the HPA stays at maxReplicas; above it, it can only ever act as a
    guard against memory growing past the plan.
    """

    target_percent: int
    planned_bytes: int  # per device, steady; 0 without a device (CPU)
    device_bytes: int
    basis: str  # how the planned figure is made up

    @property
    def planned_percent(self) -> float | None:
        return 100 * self.planned_bytes / self.device_bytes if self.device_bytes else None

    @property
    def usable(self) -> bool:
        planned = self.planned_percent
        return (planned is not None and planned < self.target_percent
                <= HIGHEST_REACHABLE_PERCENT)

    @property
    def reason(self) -> str:
        if self.usable:
            return "MemoryTargetAbovePlan"
        if not self.device_bytes:
            return "NoDeviceMemory"
        if self.target_percent <= (self.planned_percent or 0):
            return "MemoryTargetBelowPlan"
        return "MemoryTargetUnreachable"

    def _guard_advice(self) -> str:
        lowest_guard = math.floor(self.planned_percent or 0) + 1
        if lowest_guard > HIGHEST_REACHABLE_PERCENT:
            return (f"No device-memory target can act under this plan: one above it is out "
                    f"of the HPA's reach (above {HIGHEST_REACHABLE_PERCENT} %). Scale on "
                    f"{KV_CACHE_UTILIZATION.target_field} (the KV cache share in use).")
        return (f"Scale on {KV_CACHE_UTILIZATION.target_field} (the KV cache share in use, "
                f"which moves with load), or keep device memory as a guard with a target "
                f"from {lowest_guard} to {HIGHEST_REACHABLE_PERCENT} %.")

    def message(self) -> str:
        field = f"{ACCELERATOR_MEMORY_UTILIZATION.target_field} {self.target_percent} %"
        if not self.device_bytes:
            return (f"{field}: a CPU replica has no device memory, so no exporter serves the "
                    f"metric; it is left out of the HPA. Scale on "
                    f"{KV_CACHE_UTILIZATION.target_field} (the KV cache share in use).")
        planned = (f"the planned steady device memory, {self.planned_percent:.1f} % "
                   f"({self.planned_bytes / _GIB:.1f} of {self.device_bytes / _GIB:.1f} GiB "
                   f"per device: {self.basis})")
        if self.usable:
            return f"{field} is above {planned}: kept as a guard"
        if self.reason == "MemoryTargetUnreachable":
            reach = _out_of_reach(ACCELERATOR_MEMORY_UTILIZATION.target_field,
                                  self.target_percent)
            return (f"{reach} (the plan's steady figure is {planned}). It is left out of the "
                    f"HPA. {self._guard_advice()}")
        return (f"{field} is at or below {planned}, held from the moment the model loads "
                f"at any traffic: every pod would stay over target and the HPA at "
                f"maxReplicas. It is left out of the HPA. {self._guard_advice()}")


def device_memory_check(autoscaling: Autoscaling, plan: Plan) -> DeviceMemoryCheck | None:
    """The check of the device-memory target against the plan; None when none is set."""
    target = autoscaling.targets.accelerator_memory_utilization
    if target is None:
        return None
    if plan.profile.is_cpu:
        return DeviceMemoryCheck(target, 0, 0, "no device")
    device = plan.memory.available
    if plan.vllm is not None:
        fraction = plan.vllm.gpu_memory_utilization
        return DeviceMemoryCheck(target, int(device * fraction), device,
                                 f"vLLM takes --gpu-memory-utilization {fraction:g} of it")
    m = plan.memory
    return DeviceMemoryCheck(
        target, m.total, device,
        f"weights {m.weights / _GIB:.1f} + KV cache {m.kv / _GIB:.1f} + buffers "
        f"{(m.compute + m.overhead) / _GIB:.1f} GiB, allocated by llama.cpp at load")


@dataclass(frozen=True)
class KvCacheCheck:
    """Can a kvCacheUtilization target ever scale? The share stops at 100 %, and the HPA acts
    only beyond its tolerance: above HIGHEST_REACHABLE_PERCENT, never."""

    target_percent: int

    @property
    def usable(self) -> bool:
        return self.target_percent <= HIGHEST_REACHABLE_PERCENT

    @property
    def reason(self) -> str:
        return "KvCacheTargetReachable" if self.usable else "KvCacheTargetUnreachable"

    def message(self) -> str:
        field = KV_CACHE_UTILIZATION.target_field
        return (f"{_out_of_reach(field, self.target_percent)}. It is left out of the HPA: set "
                f"it to {HIGHEST_REACHABLE_PERCENT} % or less.")


def kv_cache_check(autoscaling: Autoscaling) -> KvCacheCheck | None:
    target = autoscaling.targets.kv_cache_utilization
    return None if target is None else KvCacheCheck(target)


def _unusable(check: DeviceMemoryCheck | None, kv: KvCacheCheck | None) -> frozenset[str]:
    out = set()
    if check is not None and not check.usable:
        out.add(ACCELERATOR_MEMORY_UTILIZATION.target_field)
    if kv is not None and not kv.usable:
        out.add(KV_CACHE_UTILIZATION.target_field)
    return frozenset(out)


def unusable_targets(autoscaling: Autoscaling, plan: Plan) -> frozenset[str]:
    """Target fields the HPA must leave out under this plan (see DeviceMemoryCheck and
    KvCacheCheck)."""
    return _unusable(device_memory_check(autoscaling, plan), kv_cache_check(autoscaling))


@dataclass(frozen=True)
class TargetsChoice:
    """What the main pool's autoscaler scales on under one plan: the device-memory and KV
    cache checks (None: no such target) and the HPA metrics of the targets left after them.
    Made once per render; the HPA, KEDA's triggers and the AutoscalingTargetsValid condition
    read it."""

    check: DeviceMemoryCheck | None
    unusable: frozenset[str]  # target fields left out (see the checks)
    metrics: list[dict[str, Any]]  # the HPA's spec.metrics
    kv_check: KvCacheCheck | None = None

    @property
    def metric_names(self) -> list[str]:
        return [m["pods"]["metric"]["name"] for m in self.metrics]

    @property
    def failed(self) -> list[DeviceMemoryCheck | KvCacheCheck]:
        """The checks whose target is left out, device memory first."""
        return [c for c in (self.check, self.kv_check) if c is not None and not c.usable]


def choose_targets(autoscaling: Autoscaling, plan: Plan) -> TargetsChoice:
    check, kv = device_memory_check(autoscaling, plan), kv_cache_check(autoscaling)
    unusable = _unusable(check, kv)
    return TargetsChoice(check, unusable, hpa_metrics(autoscaling, unusable), kv)


def hpa_metrics(autoscaling: Autoscaling, leave_out: Collection[str] = ()) -> list[dict[str, Any]]:
    targets = target_values(autoscaling)
    return [_pods_metric(signal.hpa_metric, decimal_quantity(targets[signal.target_field]))
            for signal in SIGNALS
            if signal.target_field in targets and signal.target_field not in leave_out]


def _rules(default: dict[str, Any], user: ScalingRules | None) -> dict[str, Any]:
    out = copy.deepcopy(default)  # fresh: the result is handed out as is
    if user is not None:
        out.update(user.model_dump(by_alias=True, exclude_none=True))
    return out


def hpa_behavior(autoscaling: Autoscaling) -> dict[str, Any]:
    user = autoscaling.behavior
    return {
        "scaleUp": _rules(_DEFAULT_SCALE_UP, user.scale_up if user else None),
        "scaleDown": _rules(_DEFAULT_SCALE_DOWN, user.scale_down if user else None),
    }


@dataclass(frozen=True)
class ScaleTarget:
    """What an autoscaler resizes through its scale subresource: a pool's Deployment, or a
    multi-node pool's leader StatefulSet or LeaderWorkerSet (whole groups)."""

    name: str
    kind: str = "Deployment"
    api_version: str = "apps/v1"


def build_hpa(
    name: str,
    namespace: str,
    labels: dict[str, str],
    owner: dict[str, Any] | None,
    target: ScaleTarget,
    autoscaling: Autoscaling,
    targets: TargetsChoice,
) -> dict[str, Any] | None:
    """The HPA, or None when no target is usable under the plan: an HPA without metrics
    would scale on CPU, so the pool keeps its size instead (the status says why)."""
    if not targets.metrics:
        return None
    return render_object(
        "horizontalpodautoscaler.yaml.j2",
        metadata=object_meta(name, namespace, labels, owner),
        target=target,
        # minReplicas 0 (scale from zero) keeps the HPA's floor at 1: an HPA leaves a
        # Deployment at 0 replicas alone, so the operator's idle scale-down and the router's
        # wake-up own 1 <-> 0 and the HPA 1 <-> N (0 itself needs the HPAScaleToZero gate).
        min_replicas=max(1, autoscaling.min_replicas),
        max_replicas=autoscaling.max_replicas,
        metrics=targets.metrics,
        behavior=hpa_behavior(autoscaling),
    )


def _long_context_behavior() -> dict[str, Any]:
    return {"scaleUp": _rules(_DEFAULT_SCALE_UP, None),
            "scaleDown": _rules(_DEFAULT_SCALE_DOWN, None)}


def long_context_hpa_wanted(long_context: Pool) -> bool:
    """The pool's own HPA exists when it may grow beyond one replica (or minReplicas)."""
    return long_context.enabled and long_context.max_replicas > max(1, long_context.min_replicas)


def build_long_context_hpa(
    name: str,
    namespace: str,
    labels: dict[str, str],
    owner: dict[str, Any] | None,
    target_deployment: str,
    long_context: Pool,
) -> dict[str, Any]:
    """1 -> N for the long-context pool, on its queued long requests.

    minReplicas is at least 1 (0 needs the HPAScaleToZero alpha gate): a pool asleep at 0
    replicas is left alone by the HPA controller (ScalingActive=False, ScalingDisabled), so the
    gateway's wake (0 -> 1) and the operator's sleep (N -> 0) never fight it. The slow-start
    behaviour defaults apply; the main pool's overrides do not (another pool, other loads).
    """
    metric = _pods_metric(QUEUE_LENGTH.hpa_metric, decimal_quantity(long_context.queue_length))
    return render_object(
        "horizontalpodautoscaler.yaml.j2", metadata=object_meta(name, namespace, labels, owner),
        target=ScaleTarget(target_deployment), min_replicas=max(1, long_context.min_replicas),
        max_replicas=long_context.max_replicas, metrics=[metric],
        behavior=_long_context_behavior())
