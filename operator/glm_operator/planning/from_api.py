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

from typing import Any, Literal

from glm_operator.api.glmservice import Engine as ApiEngine
from glm_operator.api.glmservice import GLMService
from glm_operator.api.modelversion import ModelFacts as ApiModelFacts
from glm_operator.api.modelversion import ModelFormat, ModelVersion
from glm_operator.layers import trunk_layers
from glm_operator.planning.facts import ArchitectureFacts
from glm_operator.planning.planner import PlanRequest

FactsSource = Literal["measured", "declared"]
_REQUIRED = ("architecture", "block_count", "embedding_length", "head_count", "context_length")
_COPIED = (
    "architecture", "block_count", "embedding_length", "head_count", "head_count_kv",
    "key_length", "value_length", "context_length", "nextn_predict_layers", "expert_count",
    "expert_used_count", "parameter_count", "active_parameter_count", "vocab_size",
    "feed_forward_length", "expert_feed_forward_length",
)  # fmt: skip


class ModelFactsUnknown(ValueError):
    """The ModelVersion says too little about the model to plan it."""


def engine_for(service: GLMService, model_version: ModelVersion) -> Literal["llamacpp", "vllm"]:
    """spec.engine, else the engine that serves the ModelVersion's format."""
    if service.spec.engine is not None:
        return "vllm" if service.spec.engine == ApiEngine.VLLM else "llamacpp"
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
        context_length, concurrency = pool.context_length, pool.concurrency
    return PlanRequest(
        facts=model_facts_for(model_version),
        quantization=quantization,
        engine=engine_for(service, model_version),
        accelerator=accelerator.profile,
        count=accelerator.count,
        nodes=accelerator.nodes,
        context_length=context_length,
        concurrency=concurrency,
        long_context=long_context,
    )
