"""GLMService + ModelVersion (API objects) -> PlanRequest (what the planner takes).

Model facts come from the ModelVersion: the facts measured from the GGUF header
(status.facts, status.sizeBytes) win field by field over the facts declared in spec.facts
(whose architecture defaults to spec.architecture); with neither, planning cannot start
and `ModelFactsUnknown` says which fields are missing.

Layer convention: a measured GGUF `block_count` is the header's own number, which for
glm4moe-style architectures includes the nextn (MTP) layers; the planner counts trunk layers
only, so those are subtracted here (as `ArchitectureFacts.from_gguf_metadata` does). Declared
facts already mean trunk layers (Hugging Face `num_hidden_layers`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from glm_operator.api import rules
from glm_operator.api.glmservice import ADMITTED, GLMService, GLMServiceSpec, LoadMode
from glm_operator.api.glmservice import Engine as ApiEngine
from glm_operator.api.modelversion import ModelFacts as ApiModelFacts
from glm_operator.api.modelversion import ModelFormat, ModelVersion
from glm_operator.layers import trunk_layers
from glm_operator.planning.accelerators import PROFILES, AcceleratorProfile
from glm_operator.planning.facts import (
    ArchitectureFacts,
    indexer_layer_count,
    recurrent_layer_count,
)
from glm_operator.planning.planner import Alternative, Plan, PlanRequest, plan

FactsSource = Literal["measured", "declared"]
_REQUIRED = ("architecture", "block_count", "embedding_length", "head_count", "context_length")
_COPIED = (
    "architecture", "block_count", "embedding_length", "head_count", "head_count_kv",
    "key_length", "value_length", "context_length", "nextn_predict_layers", "expert_count",
    "expert_used_count", "parameter_count", "active_parameter_count", "vocab_size",
    "feed_forward_length", "expert_feed_forward_length",
    "kv_lora_rank", "rope_dimension_count", "indexer_head_count", "indexer_key_length",
    "indexer_kpool", "kda_head_dim", "ssm_conv_kernel", "hyper_connection_count",
    "nextn_weights_bytes", "head_count_kv_per_layer", "indexer_types",
)  # fmt: skip


class ModelFactsUnknown(ValueError):
    """The ModelVersion says too little about the model to plan it."""


def engine_for(service: GLMService, model_version: ModelVersion) -> Literal["llamacpp", "vllm"]:
    """spec.engine, else the engine that serves the ModelVersion's format."""
    if service.spec.engine_name is not None:
        return "vllm" if service.spec.engine_name == ApiEngine.VLLM else "llamacpp"
    return "llamacpp" if model_version.spec.format == ModelFormat.GGUF else "vllm"


def facts_source(model_version: ModelVersion) -> FactsSource | None:
    if model_version.status.facts is not None:
        return "measured"
    if model_version.spec.facts is not None:
        return "declared"
    return None


def _as_dict(facts: ApiModelFacts | None) -> dict[str, Any]:
    if facts is None:
        return {}
    return {k: v for k in _COPIED if (v := getattr(facts, k)) is not None}


def model_facts_for(model_version: ModelVersion) -> ArchitectureFacts:
    """Planner facts: measured (status) over declared (spec), field by field."""
    name = model_version.metadata.name or "<unnamed>"
    declared = model_version.spec.facts
    measured = model_version.status.facts
    data = _as_dict(declared)
    if model_version.spec.architecture:  # the expected architecture the fetch Job checks
        data.setdefault("architecture", model_version.spec.architecture)
    measured_data = _as_dict(measured)
    arch = str(measured_data.get("architecture") or data.get("architecture") or "")
    if "block_count" in measured_data:
        measured_data["block_count"] = trunk_layers(
            arch, measured_data["block_count"], int(measured_data.get("nextn_predict_layers") or 0))
    data.update(measured_data)
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        camel = ", ".join(_camel(k) for k in missing)
        raise ModelFactsUnknown(
            f"ModelVersion {name}: model facts unknown ({camel}); they are measured from the "
            "GGUF header once the fetch Job has run, or can be declared in spec.facts"
        )
    data.setdefault("head_count_kv", data["head_count"])
    # Per-layer lists become the planner's counts over the trunk layers, as in
    # ArchitectureFacts.from_gguf_metadata (0 KV heads: a recurrent KDA layer).
    per_layer_kv = data.pop("head_count_kv_per_layer", None)
    if per_layer_kv:
        data["recurrent_layers"] = recurrent_layer_count(per_layer_kv, data["block_count"])
    types = data.pop("indexer_types", None)
    if types:
        data["indexer_layers"] = indexer_layer_count(types, data["block_count"])
    size = model_version.status.size_bytes or (declared.size_bytes if declared else None)
    quantization = _quantization(model_version)
    if size and quantization:
        data["weights_bytes"] = size
        data["quantization"] = quantization
    try:
        return ArchitectureFacts.from_mapping(data)
    except ValueError as exc:
        raise ModelFactsUnknown(
            f"ModelVersion {name}: model facts are inconsistent: {exc}"
        ) from exc


def _quantization(model_version: ModelVersion) -> str | None:
    measured = model_version.status.facts.file_type if model_version.status.facts else None
    declared = model_version.spec.facts.file_type if model_version.spec.facts else None
    return model_version.spec.quantization or measured or declared


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def plan_request_for(
    service: GLMService, model_version: ModelVersion, *, long_context: bool = False
) -> PlanRequest:
    """The planner's request for the service's main pool, or its long-context pool."""
    spec = service.spec
    quantization = _quantization(model_version)
    if not quantization:
        raise ModelFactsUnknown(
            f"ModelVersion {model_version.metadata.name}: quantization unknown: set "
            "spec.quantization (or let the fetch Job measure the GGUF file type)"
        )
    accelerator = spec.accelerator
    context_length, concurrency = spec.context_length, spec.concurrency
    if long_context:
        pool = spec.long_context
        if pool is None or not pool.enabled or pool.context_length is None:
            raise ValueError(f"GLMService {service.metadata.name}: longContext is not enabled")
        accelerator = pool.accelerator or spec.accelerator
        context_length, concurrency = pool.context_length, pool.effective_concurrency
    offload = spec.cpu_offload
    vllm = spec.engine.vllm if spec.engine is not None else None
    # The forced layout is the main pool's: the long-context pool's devices differ.
    forced = vllm if vllm is not None and not long_context else None
    return PlanRequest(
        facts=model_facts_for(model_version),
        quantization=quantization,
        engine=engine_for(service, model_version),
        accelerator=accelerator.profile,
        count=accelerator.count,
        nodes=accelerator.nodes,
        context_length=context_length,
        concurrency=concurrency,
        kv_cache_type=spec.kv_cache_type,
        kv_unified=bool(spec.kv_unified),
        long_context=long_context,
        mmap=spec.load_mode != LoadMode.NO_MMAP,
        gpu_layers=offload.accelerator_layers if offload else None,
        cpu_offload_gib=(offload.host_weights_gib or 0) if offload else 0,
        multi_token_prediction=spec.multi_token_prediction,
        layout=forced.layout if forced is not None else None,
        rank_tensor_parallel=(forced.rank_tensor_parallel or 1) if forced is not None else 1,
        kv_offload_gib=(vllm.kv_offload_gib or 0) if vllm is not None else 0,
    )


# --- advice that can be applied ------------------------------------------------------------


@dataclass(frozen=True)
class AppliedAlternative:
    """An alternative of an infeasible plan as the merge patch of the GLMService that applies
    it; the patched service was planned again (every pool) and fits."""

    alternative: Alternative
    patch: dict[str, Any]

    def command(self, service: GLMService) -> str:
        body = json.dumps(self.patch, separators=(",", ":"), sort_keys=True)
        return (f"kubectl patch glms {service.metadata.name} -n {service.metadata.namespace} "
                f"--type merge -p '{body}'")


def _accelerator_patch(spec: GLMServiceSpec, settings: Mapping[str, Any],
                       long_context: bool) -> dict[str, Any]:
    changed = {key: settings[name] for name, key in
               (("accelerator", "profile"), ("count", "count"), ("nodes", "nodes"))
               if name in settings}
    if not changed:
        return {}
    if not long_context:
        return {"accelerator": changed}
    pool = spec.long_context
    if pool is not None and pool.accelerator is not None:
        return {"longContext": {"accelerator": changed}}
    # The pool shares spec.accelerator: give it its own, so the main pool stays as it is.
    own = spec.accelerator.model_dump(by_alias=True, mode="json", exclude_none=True)
    return {"longContext": {"accelerator": {**own, **changed}}}


# PlanRequest fields that are an engine's own setting: (engine, its key under spec.engine).
_ENGINE_FIELDS = {"kv_cache_type": ("", "kvCacheType"),
                  "layout": ("vllm", "layout"),
                  "rank_tensor_parallel": ("vllm", "rankTensorParallel"),
                  "gpu_layers": ("llamacpp", "acceleratorLayers"),
                  "cpu_offload_gib": ("vllm", "cpuOffloadGiB"),
                  "kv_offload_gib": ("vllm", "kvOffloadGiB")}


def spec_patch(service: GLMService, settings: Mapping[str, Any],
               long_context: bool = False, engine_name: str = "") -> dict[str, Any] | None:
    """The JSON merge patch ({"spec": ...}) that asks for the PlanRequest fields `settings`,
    for the main pool or the long-context pool; None when one of them has no GLMService field
    (the quantization belongs to the ModelVersion). `engine_name` is the engine the plan runs,
    whose key an engine setting goes under."""
    spec = service.spec
    engine_name = engine_name or (spec.engine_name or "")
    patch: dict[str, Any] = _accelerator_patch(spec, settings, long_context)
    pool_fields = {"context_length": "contextLength", "concurrency": "concurrency"}
    for name, value in settings.items():
        if name in ("accelerator", "count", "nodes"):
            continue
        if name in pool_fields:
            if long_context:
                patch.setdefault("longContext", {})[pool_fields[name]] = value
            else:
                patch[pool_fields[name]] = value
        elif name in _ENGINE_FIELDS:
            engine, key = _ENGINE_FIELDS[name]
            if name == "kv_cache_type":
                engine = engine_name
            settings_of = patch.setdefault("engine", {}).setdefault(engine, {})
            settings_of[key] = value or None
        else:
            return None
    chosen = set(patch.get("engine", {}))
    if chosen and service.spec.engine_name is not None and chosen != {service.spec.engine_name}:
        return None  # a setting of the engine the service does not run
    if "engine" in patch and spec.engine_name is None:
        # Naming the engine's settings names the engine: the one the plan already runs.
        patch["engine"] = {name: {k: v for k, v in fields.items() if v is not None}
                           for name, fields in patch["engine"].items()}
    return {"spec": patch}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _patched(service: GLMService, patch: dict[str, Any]) -> GLMService | None:
    """The service with the patch applied, if the API's rules admit it: its schema, and no
    CEL rule broken that the service did not break already (api/rules.py; the API server
    ratchets rules an object predates the same way)."""
    body = service.model_dump(by_alias=True, mode="json", exclude_none=True)
    try:
        patched = GLMService.model_validate(merge_patch(body, patch), context={ADMITTED: True})
    except ValidationError:
        return None
    if _broken(patched) - _broken(service):
        return None
    return patched


# The CEL rules cost about 5 ms each in cel-python's interpreter; a reconcile of an infeasible
# service asks them of the service and of each alternative, and asks again on every reconcile
# of the same spec (and of copies of it): remembered by the spec's JSON.
@functools.lru_cache(maxsize=2048)
def _broken_rules_of(spec_json: str) -> frozenset[str]:
    return frozenset(rules.broken(GLMServiceSpec.model_validate_json(
        spec_json, context={ADMITTED: True})))


def _broken(service: GLMService) -> frozenset[str]:
    """The CEL rules `service` breaks (api/rules.py), remembered by its spec."""
    return _broken_rules_of(service.spec.model_dump_json(by_alias=True, exclude_none=True))


# A further judgement on a patched service, with its plans (main, long-context or None):
# decide/ adds what the planner does not see (a ReadWriteOnce cache that pins to one node).
Acceptable = Callable[[GLMService, ModelVersion, Plan, "Plan | None"], bool]


def _fits(service: GLMService, model_version: ModelVersion,
          profiles: Mapping[str, AcceleratorProfile], acceptable: Acceptable | None) -> bool:
    pool = service.spec.long_context
    try:
        main = plan(plan_request_for(service, model_version), profiles, with_alternatives=False)
        lc = (plan(plan_request_for(service, model_version, long_context=True), profiles,
                   with_alternatives=False) if pool is not None and pool.enabled else None)
    except ValueError:  # ModelFactsUnknown, PlanInputError, unknown profile
        return False
    if not main.feasible or (lc is not None and not lc.feasible):
        return False
    return acceptable is None or acceptable(service, model_version, main, lc)


def applicable_alternatives(
    service: GLMService, model_version: ModelVersion, infeasible: Plan,
    model_versions: Sequence[ModelVersion] = (),
    profiles: Mapping[str, AcceleratorProfile] | None = None,
    acceptable: Acceptable | None = None,
) -> tuple[list[AppliedAlternative], list[Alternative]]:
    """The infeasible plan's alternatives as patches that make the whole service fit, and
    those that no patch of the GLMService applies (a quantization with no ModelVersion in
    the namespace, a change that another pool or an API rule refuses)."""
    catalog = PROFILES if profiles is None else profiles
    long_context = infeasible.request.long_context
    applied: list[AppliedAlternative] = []
    left: list[Alternative] = []
    for alternative in infeasible.alternatives:
        settings = alternative.settings
        if set(settings) == {"quantization"}:
            found = _other_version(service, model_version, settings["quantization"],
                                   model_versions, catalog, acceptable)
            if found is not None:
                applied.append(AppliedAlternative(alternative, found))
            else:
                left.append(alternative)
            continue
        patch = spec_patch(service, settings, long_context, infeasible.request.engine)
        patched = _patched(service, patch) if patch is not None else None
        if patch is not None and patched is not None and _fits(patched, model_version,
                                                                catalog, acceptable):
            applied.append(AppliedAlternative(alternative, patch))
        else:
            left.append(alternative)
    return applied, left


def _other_version(service: GLMService, model_version: ModelVersion, quantization: str,
                   model_versions: Sequence[ModelVersion],
                   profiles: Mapping[str, AcceleratorProfile],
                   acceptable: Acceptable | None) -> dict[str, Any] | None:
    """A patch onto another ModelVersion of the same model in that quantization, if one in
    the namespace makes the service fit."""
    try:
        facts = model_facts_for(model_version)
    except ModelFactsUnknown:
        return None
    for other in model_versions:
        name = other.metadata.name
        if not name or name == model_version.metadata.name:
            continue
        quant = _quantization(other)
        if quant is None or quant.lower() != quantization.lower():
            continue
        try:
            same = _same_model(facts, model_facts_for(other))
        except ModelFactsUnknown:
            continue
        patch = {"spec": {"modelVersion": name}}
        patched = _patched(service, patch) if same else None
        if patched is not None and _fits(patched, other, profiles, acceptable):
            return patch
    return None


def _same_model(a: ArchitectureFacts, b: ArchitectureFacts) -> bool:
    return all(getattr(a, k) == getattr(b, k) for k in _SAME_MODEL)


_SAME_MODEL = ("architecture", "block_count", "embedding_length", "head_count",
               "head_count_kv", "context_length")
