"""Conversion between the served versions of the API, on whole objects as JSON.

The API server stores GLMServices at v1alpha2 and serves v1alpha1 too; the operator's
conversion webhook calls `convert` for every object read or written at the other version, and
`glm-operator convert` rewrites manifests for Git. ModelVersion's schema did not change: only
its apiVersion moves.

v1alpha1 -> v1alpha2, for GLMService:
- the engine's own settings move under the engine's key: `engine: vllm` with `kvCacheType:
  fp8` becomes `engine: {vllm: {kvCacheType: fp8}}`; `cpuOffload.acceleratorLayers` is
  `engine.llamacpp.acceleratorLayers`, `cpuOffload.hostWeightsGiB` `engine.vllm.cpuOffloadGiB`.
  Without `engine`, the settings name it where they belong to one engine only (the two KV
  type lists do not overlap); with no setting the engine stays unnamed (the model's format);
- `routing.idleSeconds`, the main pool's idle time, is `idleSeconds` beside the pool's other
  fields;
- an enabled `longContext` becomes a pool of the main pool's type: `minReplicas`,
  `maxReplicas` and `queueLength` its `autoscaling` (left out where they are the defaults:
  sleep at 0, wake to 1, one waiting request), `enabled` its presence;
- `gateway.rateLimit.store` is cluster configuration at v1alpha2 (the operator's config).

What v1alpha2 cannot hold (a disabled longContext's settings, the store, an engine implied by
its settings, settings of the engine not named) is kept in the annotation STASH_ANNOTATION, so
that v1alpha1 -> v1alpha2 -> v1alpha1 gives back the object read (the API server converts on
every read and write at v1alpha1, and a round trip must lose nothing). The operator honours a
stashed rate-limit store for that service and says it is deprecated.

The other way, what v1alpha1 has no field for (vLLM's layout, rankTensorParallel,
kvOffloadGiB; a long-context pool's fixed replicas) is kept in V1ALPHA2_STASH_ANNOTATION while
the object is read and written at v1alpha1, so v1alpha2 -> v1alpha1 -> v1alpha2 loses nothing
either (tests/api/test_conversion.py holds both round trips over generated objects).

Pure and total on objects the API server admitted: it never raises on them, since a failed
conversion makes the object unreadable at that version. Input that is not an object of a
served version raises ConversionError.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from glm_operator.api.glmservice import VLLM_KV_CACHE_TYPES
from glm_operator.wellknown import CONVERSION_STASH_ANNOTATION, GROUP

V1ALPHA1, V1ALPHA2 = "v1alpha1", "v1alpha2"
SERVED_VERSIONS = (V1ALPHA1, V1ALPHA2)
STORAGE_VERSION = V1ALPHA2
KINDS = ("GLMService", "ModelVersion")
STASH_ANNOTATION = CONVERSION_STASH_ANNOTATION
# What v1alpha1 cannot hold of a v1alpha2 object, kept while it is read and written at
# v1alpha1 (kubectl edit, an old client) so that v1alpha2 -> v1alpha1 -> v1alpha2 loses nothing.
V1ALPHA2_STASH_ANNOTATION = f"{GROUP}/v1alpha2-fields"
# The vLLM settings v1alpha1 has a field for (under their v1alpha2 names).
_VLLM_V1ALPHA1_KEYS = frozenset({"kvCacheType", "cpuOffloadGiB", "parsers",
                                 "multiTokenPrediction"})

Json = dict[str, Any]

# v1alpha1's top-level engine settings: the v1alpha2 key each takes under its engine.
_LLAMACPP_FIELDS = {"kvUnified": "kvUnified", "loadMode": "loadMode"}
_VLLM_FIELDS = {"parsers": "parsers", "multiTokenPrediction": "multiTokenPrediction"}
_LONG_CONTEXT_DEFAULTS = {"minReplicas": 0, "maxReplicas": 1, "queueLength": 1}
_IDLE_SECONDS_DEFAULT = 600  # routing.idleSeconds at v1alpha1, spec.idleSeconds at v1alpha2


class ConversionError(ValueError):
    """The input is not an object of a served version and kind."""


def api_version(version: str) -> str:
    return f"{GROUP}/{version}"


def convert(obj: Json, desired_api_version: str) -> Json:
    """`obj` at `desired_api_version`, as a new object (the input is not changed)."""
    if not isinstance(obj, dict):
        raise ConversionError("the object is not a JSON object")
    source, desired = _version(obj.get("apiVersion")), _version(desired_api_version)
    kind = obj.get("kind")
    if kind not in KINDS:
        raise ConversionError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    out = copy.deepcopy(obj)
    out["apiVersion"] = api_version(desired)
    if kind != "GLMService" or source == desired:
        return out
    if desired == V1ALPHA2:
        return _up(out)
    return _down(out)


def _version(value: object) -> str:
    group, _, version = str(value).rpartition("/")
    if group != GROUP or version not in SERVED_VERSIONS:
        raise ConversionError(f"apiVersion {value!r} is not one of "
                              f"{', '.join(api_version(v) for v in SERVED_VERSIONS)}")
    return version


# --- v1alpha1 -> v1alpha2 ------------------------------------------------------------------


def _up(obj: Json) -> Json:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        _pop_stash(obj, V1ALPHA2_STASH_ANNOTATION)
        return obj
    stash: Json = {}
    _engine_up(spec, stash)
    routing = spec.get("routing")
    if isinstance(routing, dict) and "idleSeconds" in routing:
        spec["idleSeconds"] = routing.pop("idleSeconds")
    _long_context_up(spec, stash)
    gateway = spec.get("gateway")
    rate_limit = gateway.get("rateLimit") if isinstance(gateway, dict) else None
    if isinstance(rate_limit, dict) and "store" in rate_limit:
        stash["rateLimitStore"] = rate_limit.pop("store")
    _restore_v1alpha2_fields(spec, _pop_stash(obj, V1ALPHA2_STASH_ANNOTATION))
    _put_stash(obj, STASH_ANNOTATION, stash)
    return obj


def _put_stash(obj: Json, key: str, stash: Json) -> None:
    if not stash:
        return
    metadata = obj.setdefault("metadata", {})
    annotations = metadata.get("annotations")
    if not isinstance(annotations, dict):
        annotations = metadata["annotations"] = {}
        stash["annotationsAdded"] = True
    annotations[key] = json.dumps(stash, sort_keys=True, separators=(",", ":"))


def _restore_v1alpha2_fields(spec: Json, kept: Json) -> None:
    """What a v1alpha2 object held that v1alpha1 cannot, back where it was, unless the
    object was changed at v1alpha1 so that it no longer applies."""
    engine = spec.get("engine")
    vllm = engine.get("vllm") if isinstance(engine, dict) else None
    if isinstance(vllm, dict):
        for key, value in (kept.get("vllm") or {}).items():
            vllm.setdefault(key, value)
    pool = spec.get("longContext")
    if not isinstance(pool, dict):
        return
    scaling = pool.get("autoscaling")
    bounds = ((scaling.get("minReplicas"), scaling.get("maxReplicas"))
              if isinstance(scaling, dict) else (0, 1))
    replicas = kept.get("longContextReplicas")
    if isinstance(replicas, int) and bounds == (replicas, max(1, replicas)):
        pool.pop("autoscaling", None)
        pool["replicas"] = replicas
    elif kept.get("longContextAutoscaled") and scaling is None:
        # Autoscaling written with v1alpha1's defaults (sleep at 0, wake to 1, one request).
        pool["autoscaling"] = {"minReplicas": 0, "maxReplicas": 1,
                               "targets": {"queueLength": 1}}


def _engine_up(spec: Json, stash: Json) -> None:
    llamacpp: Json = {}
    vllm: Json = {}
    kv = spec.pop("kvCacheType", None)
    if kv is not None:
        (vllm if kv in VLLM_KV_CACHE_TYPES else llamacpp)["kvCacheType"] = kv
    for old, new in _LLAMACPP_FIELDS.items():
        if old in spec:
            llamacpp[new] = spec.pop(old)
    for old, new in _VLLM_FIELDS.items():
        if old in spec:
            vllm[new] = spec.pop(old)
    offload = spec.pop("cpuOffload", None)
    if isinstance(offload, dict):
        if "acceleratorLayers" in offload:
            llamacpp["acceleratorLayers"] = offload["acceleratorLayers"]
        if "hostWeightsGiB" in offload:
            vllm["cpuOffloadGiB"] = offload["hostWeightsGiB"]
    named = spec.pop("engine", None)
    if named is not None and named not in ("llamacpp", "vllm"):
        raise ConversionError(f"spec.engine {named!r} is not a v1alpha1 engine (llamacpp, vllm)")
    if named is None and llamacpp and vllm:
        # Settings of both engines and none named: v1alpha1 took it and let the model's
        # format decide; v1alpha2 cannot say it, so the settings wait in the stash.
        stash["engineSettings"] = {"llamacpp": llamacpp, "vllm": vllm}
        return
    if named is None:
        if not (llamacpp or vllm):
            return
        named = "llamacpp" if llamacpp else "vllm"
        stash["engineImplied"] = True
    mine, other = (llamacpp, vllm) if named == "llamacpp" else (vllm, llamacpp)
    if other:
        stash["engineSettings"] = {("vllm" if named == "llamacpp" else "llamacpp"): other}
    spec["engine"] = {named: mine}


def _long_context_up(spec: Json, stash: Json) -> None:
    long_context = spec.pop("longContext", None)
    if not isinstance(long_context, dict):
        return
    if not long_context.get("enabled"):
        stash["longContext"] = long_context
        return
    pool: Json = {k: long_context[k] for k in ("accelerator", "contextLength", "concurrency",
                                                "idleSeconds") if k in long_context}
    bounds = {k: long_context.get(k, default) for k, default in _LONG_CONTEXT_DEFAULTS.items()}
    if bounds != _LONG_CONTEXT_DEFAULTS:
        pool["autoscaling"] = {"minReplicas": bounds["minReplicas"],
                               "maxReplicas": bounds["maxReplicas"],
                               "targets": {"queueLength": bounds["queueLength"]}}
    spec["longContext"] = pool


# --- v1alpha2 -> v1alpha1 ------------------------------------------------------------------


def _down(obj: Json) -> Json:
    spec = obj.get("spec")
    stash = _pop_stash(obj, STASH_ANNOTATION)
    if not isinstance(spec, dict):
        return obj
    _put_stash(obj, V1ALPHA2_STASH_ANNOTATION, _v1alpha2_only(spec))
    _engine_down(spec, stash)
    if "idleSeconds" in spec:
        idle = spec.pop("idleSeconds")
        routing = spec.get("routing")
        # v1alpha2 defaults it where v1alpha1 had no routing at all: the default is the same
        # in both, so it is not written into a routing the object never had.
        if isinstance(routing, dict) or idle != _IDLE_SECONDS_DEFAULT:
            if not isinstance(routing, dict):
                routing = spec["routing"] = {}
            routing["idleSeconds"] = idle
    _long_context_down(spec, stash)
    if "rateLimitStore" in stash:
        gateway = spec.get("gateway")
        rate_limit = gateway.get("rateLimit") if isinstance(gateway, dict) else None
        if isinstance(rate_limit, dict):
            rate_limit["store"] = stash["rateLimitStore"]
    return obj


def _v1alpha2_only(spec: Json) -> Json:
    """What v1alpha1 has no field for: vLLM settings added since (layout, rankTensorParallel,
    kvOffloadGiB...), and a long-context pool's fixed replicas (v1alpha1: its bounds)."""
    kept: Json = {}
    engine = spec.get("engine")
    vllm = engine.get("vllm") if isinstance(engine, dict) else None
    if isinstance(vllm, dict):
        extra = {k: v for k, v in vllm.items() if k not in _VLLM_V1ALPHA1_KEYS}
        if extra:
            kept["vllm"] = extra
    pool = spec.get("longContext")
    if isinstance(pool, dict) and isinstance(pool.get("replicas"), int):
        kept["longContextReplicas"] = pool["replicas"]
    elif isinstance(pool, dict) and _default_bounds(pool.get("autoscaling")):
        kept["longContextAutoscaled"] = True  # v1alpha1 -> v1alpha2 would leave it out
    return kept


def _default_bounds(scaling: object) -> bool:
    """Autoscaling with v1alpha1's long-context bounds (0, 1, one waiting request)."""
    if not isinstance(scaling, dict):
        return False
    targets = scaling.get("targets")
    return (scaling.get("minReplicas"), scaling.get("maxReplicas")) == (0, 1) and isinstance(
        targets, dict) and targets.get("queueLength", 1) == 1


def _pop_stash(obj: Json, key: str) -> Json:
    metadata = obj.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    if not isinstance(annotations, dict) or key not in annotations:
        return {}
    try:
        stash = json.loads(annotations.pop(key))
    except (TypeError, ValueError):
        return {}
    if not isinstance(stash, dict):
        return {}
    if stash.get("annotationsAdded") and not annotations and isinstance(metadata, dict):
        del metadata["annotations"]
    return stash


def _engine_down(spec: Json, stash: Json) -> None:
    engine = spec.pop("engine", None)
    settings = {**(stash.get("engineSettings") or {})}
    named = None
    if isinstance(engine, dict):
        for name in ("llamacpp", "vllm"):
            if isinstance(engine.get(name), dict):
                named = name
                settings[name] = engine[name]
    if named is not None and not stash.get("engineImplied"):
        spec["engine"] = named
    llamacpp, vllm = settings.get("llamacpp") or {}, settings.get("vllm") or {}
    kv = llamacpp.get("kvCacheType", vllm.get("kvCacheType"))
    if kv is not None:
        spec["kvCacheType"] = kv
    for old, new in _LLAMACPP_FIELDS.items():
        if new in llamacpp:
            spec[old] = llamacpp[new]
    for old, new in _VLLM_FIELDS.items():
        if new in vllm:
            spec[old] = vllm[new]
    offload = {}
    if "acceleratorLayers" in llamacpp:
        offload["acceleratorLayers"] = llamacpp["acceleratorLayers"]
    if "cpuOffloadGiB" in vllm:
        offload["hostWeightsGiB"] = vllm["cpuOffloadGiB"]
    if offload:
        spec["cpuOffload"] = offload


def _long_context_down(spec: Json, stash: Json) -> None:
    pool = spec.pop("longContext", None)
    if not isinstance(pool, dict):
        if "longContext" in stash:
            spec["longContext"] = stash["longContext"]
        return
    long_context: Json = {"enabled": True}
    long_context.update({k: pool[k] for k in ("contextLength", "concurrency", "accelerator")
                         if k in pool})
    bounds = dict(_LONG_CONTEXT_DEFAULTS)
    scaling = pool.get("autoscaling")
    if isinstance(pool.get("replicas"), int):
        bounds.update(minReplicas=pool["replicas"], maxReplicas=max(1, pool["replicas"]))
    elif isinstance(scaling, dict):
        found = scaling.get("targets")
        targets: Json = found if isinstance(found, dict) else {}
        bounds.update(minReplicas=scaling.get("minReplicas", 1),
                      maxReplicas=scaling.get("maxReplicas", 1),
                      queueLength=targets.get("queueLength", 1))
    long_context.update(bounds)
    if "idleSeconds" in pool:
        long_context["idleSeconds"] = pool["idleSeconds"]
    spec["longContext"] = long_context

