"""ModelVersion (short name `mv`): one immutable model artifact.

A ModelVersion names where the weights come from, what they are (format, quantization,
architecture, sha256) and where they are cached. The operator fetches it once into a
PVC, verifies the sha256 and, for GGUF, reads the header; status then holds the measured
facts the capacity planner prefers over the declared ones in `spec.facts`.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, field_validator

from glm_operator.api.base import (
    API_VERSION,
    GROUP,
    Int64,
    ObjectMeta,
    PositiveQuantity,
    SecretName,
    SpecModel,
    StatusModel,
)
from glm_operator.api.conditions import MAX_CONDITIONS, Condition

SHA256_PATTERN = r"^[a-f0-9]{64}$"
MAX_LAYER_LIST = 1024  # entries of a per-layer list in ModelFacts (as blockCount's bound)

# One regex per accepted scheme. RE2 (CEL) and Python `re` agree on this subset.
SOURCE_URI_PATTERNS: dict[str, str] = {
    "http(s)": r"^https?://[^/?#\s]+(/[^\s]*)?$",
    "s3": r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/[^\s]+$",
    "hf": r"^hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*(/[^?\s]+)?(\?revision=[^&\s]+)?$",
    "pvc": r"^pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/[^\s]+$",
}
SOURCE_URI_MESSAGE = (
    "must be one of https://host/path, http://host/path, s3://bucket/key, "
    "hf://org/repo[/file][?revision=REV] or pvc://claim/path"
)


class ModelFormat(StrEnum):
    GGUF = "gguf"
    SAFETENSORS = "safetensors"


class ModelVersionPhase(StrEnum):
    PENDING = "Pending"
    FETCHING = "Fetching"
    VERIFYING = "Verifying"
    READY = "Ready"
    FAILED = "Failed"


class ModelVersionConditionType(StrEnum):
    VERIFIED = "Verified"
    CACHED = "Cached"
    READY = "Ready"


def _source_uri_rule() -> str:
    # CEL raw strings (r'...'): the patterns hold backslashes, which a plain CEL string
    # would read as (invalid) escapes.
    return " || ".join(f"self.matches(r'{p}')" for p in SOURCE_URI_PATTERNS.values())


class ModelSource(SpecModel):
    """Where the artifact is downloaded from. Immutable once set."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "self == oldSelf",
                    "message": "source is immutable: create a new ModelVersion instead",
                }
            ]
        }
    }

    uri: str = Field(
        min_length=1,
        max_length=2048,
        description=(
            "Artifact location: https://host/path, s3://bucket/key, "
            "hf://org/repo/file?revision=REV (a file; for safetensors the repository, "
            "hf://org/repo?revision=REV) or pvc://claim/path (already on a volume)."
        ),
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": _source_uri_rule(), "message": f"source.uri {SOURCE_URI_MESSAGE}"}
            ]
        },
    )
    credentials_secret: SecretName | None = Field(
        default=None,
        description=(
            "Secret in the same namespace with the download credentials: HF_TOKEN for hf://, "
            "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and optional AWS_ENDPOINT_URL) for "
            "s3://, AUTHORIZATION (a header value) for https://."
        ),
    )

    @field_validator("uri")
    @classmethod
    def _uri_scheme(cls, uri: str) -> str:
        if not any(re.match(p, uri) for p in SOURCE_URI_PATTERNS.values()):
            raise ValueError(f"source.uri {SOURCE_URI_MESSAGE}, got {uri!r}")
        return uri


class ModelCache(SpecModel):
    """The PVC the artifact is downloaded into, once, and that engine pods mount read-only."""

    storage_class_name: str | None = Field(
        default=None,
        max_length=253,
        description="StorageClass of the cache PVC; the cluster default when unset.",
    )
    size: PositiveQuantity | None = Field(
        default=None,
        description=(
            "Requested PVC size (e.g. 20Gi). When unset: the declared facts.sizeBytes plus 10%, "
            "else a default from operator config."
        ),
    )
    access_mode: Literal["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"] = Field(
        default="ReadWriteOnce",
        description=(
            "ReadWriteMany (or ReadOnlyMany once filled) lets replicas on different nodes, and "
            "the nodes of a multi-node group, share one copy. ReadWriteOnce: one node mounts "
            "the volume, so every pod serving this version is placed on that node (required "
            "pod affinity on kubernetes.io/hostname); replicas that cannot all fit on one "
            "node, and multi-node groups, are refused (Planned=False, CacheNotShareable)."
        ),
    )


class ModelFacts(SpecModel):
    """Architecture facts, GGUF names in camelCase (block_count -> blockCount).

    Declared in spec.facts when the header has not been measured (safetensors, or
    before the fetch); measured into status.facts from the GGUF header. The planner
    prefers measured facts.
    """

    architecture: str | None = Field(
        default=None, max_length=64, description="general.architecture, e.g. glm4, glm4moe."
    )
    block_count: int | None = Field(default=None, ge=1, le=1024, description="Layers.")
    embedding_length: int | None = Field(default=None, ge=1, le=1048576, description="n_embd.")
    head_count: int | None = Field(default=None, ge=1, le=4096, description="Attention heads.")
    head_count_kv: int | None = Field(
        default=None, ge=1, le=4096, description="KV heads (GQA); equals headCount when absent."
    )
    key_length: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="Per-head K size; embeddingLength/headCount when absent.",
    )
    value_length: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="Per-head V size; embeddingLength/headCount when absent.",
    )
    context_length: int | None = Field(
        default=None, ge=1, le=16777216, description="Training context length (n_ctx_train)."
    )
    feed_forward_length: int | None = Field(
        default=None,
        ge=1,
        le=16777216,
        description=(
            "FFN intermediate width (n_ff; Hugging Face intermediate_size); for MoE the dense "
            "layers' width. Sizes llama.cpp's compute buffer; 4 x embeddingLength when absent."
        ),
    )
    expert_feed_forward_length: int | None = Field(
        default=None,
        ge=1,
        le=16777216,
        description="MoE: one expert's FFN width (n_ff_exp; Hugging Face moe_intermediate_size).",
    )
    nextn_predict_layers: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description="Multi-token-prediction layers (GLM-4.5 style), counted in the KV cache.",
    )
    expert_count: int | None = Field(default=None, ge=0, le=4096, description="MoE experts.")
    expert_used_count: int | None = Field(
        default=None, ge=0, le=4096, description="Experts active per token."
    )
    parameter_count: Int64 | None = Field(default=None, ge=1, description="Total parameters.")
    active_parameter_count: Int64 | None = Field(
        default=None, ge=1, description="Parameters used per token (MoE)."
    )
    vocab_size: int | None = Field(default=None, ge=1, le=16777216, description="Tokens.")
    size_bytes: Int64 | None = Field(
        default=None, ge=1, description="Artifact size in bytes (all shards)."
    )
    file_type: str | None = Field(
        default=None, max_length=32, description="general.file_type as a name, e.g. Q4_K_M."
    )
    # MLA, the DSA indexer, KDA linear attention and mHC (glm-dsa, glm5-next, deepseek2):
    # what sizes their KV cache and state (docs/planning.md, "KV cache").
    head_count_kv_per_layer: list[Annotated[int, Field(ge=0, le=4096)]] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_LAYER_LIST,
        description=(
            "attention.head_count_kv when the GGUF gives it per block (nextn blocks included): "
            "0 marks a recurrent (KDA linear attention) layer, which holds a fixed state per "
            "sequence instead of KV (glm5-next)."
        ),
    )
    kv_lora_rank: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description=(
            "attention.kv_lora_rank (MLA): the KV cache holds this latent plus "
            "ropeDimensionCount values per token and layer, and no V."
        ),
    )
    rope_dimension_count: int | None = Field(
        default=None,
        ge=0,
        le=65536,
        description="rope.dimension_count: rotated dims (MLA: cached next to the latent).",
    )
    indexer_head_count: int | None = Field(
        default=None, ge=1, le=4096, description="attention.indexer.head_count (DSA indexer)."
    )
    indexer_key_length: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="attention.indexer.key_length: the indexer's cached key per token and layer.",
    )
    indexer_kpool: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description=(
            "attention.indexer.kpool: k-pool compression (glm5-next); above 1 the indexer "
            "caches key, gate and pooled key per token."
        ),
    )
    indexer_types: list[bool] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_LAYER_LIST,
        description=(
            "attention.indexer.types: per trunk layer, true where it runs the full indexer "
            "(and caches its keys); unset: every attention layer does."
        ),
    )
    kda_head_dim: int | None = Field(
        default=None, ge=1, le=65536, description="kda.head_dim: the KDA layers' head width."
    )
    ssm_conv_kernel: int | None = Field(
        default=None, ge=1, le=1024, description="ssm.conv_kernel: the KDA convolution window."
    )
    hyper_connection_count: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description="hyper_connection.count (mHC): residual streams of embeddingLength each.",
    )
    nextn_weights_bytes: Int64 | None = Field(
        default=None,
        ge=1,
        description=(
            "Bytes of the nextn (MTP) layers' tensors in the file, summed from the GGUF tensor "
            "infos; the pinned llama.cpp does not load them."
        ),
    )


class ModelVersionSpec(SpecModel):
    """One immutable model artifact: source, format, quantization, expected architecture."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "!has(oldSelf.sha256) || "
                    "(has(self.sha256) && self.sha256 == oldSelf.sha256)",
                    "message": "sha256 is immutable once set",
                    "fieldPath": ".sha256",
                },
                {
                    "rule": "self.format == oldSelf.format",
                    "message": "format is immutable",
                    "fieldPath": ".format",
                },
                {
                    "rule": "!has(oldSelf.quantization) || (has(self.quantization) && "
                    "self.quantization == oldSelf.quantization)",
                    "message": "quantization is immutable once set",
                    "fieldPath": ".quantization",
                },
            ]
        }
    }

    source: ModelSource
    format: ModelFormat = Field(
        description="gguf (served by llama.cpp) or safetensors (served by vLLM)."
    )
    quantization: str | None = Field(
        default=None,
        max_length=32,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description=(
            "Weight quantization: Q4_K_M, Q5_K_M, Q6_K, Q8_0, F16, BF16 (GGUF) or "
            "awq, gptq, fp8, bf16 (safetensors). Used by the planner for the weight size "
            "when facts.sizeBytes is unknown."
        ),
    )
    architecture: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^[a-z0-9][a-z0-9_.-]*$",
        description=(
            "Expected architecture (glm4, glm4moe, chatglm, glm-dsa, llama, ...). The fetch "
            "Job compares it with the GGUF header (safetensors: config.json's architectures "
            "and model_type) and sets Verified=False on a mismatch."
        ),
    )
    sha256: str | None = Field(
        default=None,
        pattern=SHA256_PATTERN,
        max_length=64,
        description=(
            "Expected SHA-256 (lowercase hex) of the file; verified after download. For a "
            "folder source (hf://org/repo, s3://bucket/prefix/) the snapshot digest: the "
            "SHA-256 of the `sha256sum` lines of its files sorted by path (docs/fetch.md)."
        ),
    )
    cache: ModelCache = Field(
        default_factory=ModelCache, description="The PVC the artifact is cached in."
    )
    facts: ModelFacts | None = Field(
        default=None,
        description="Declared model facts, used by the planner until the header is measured.",
    )


class CacheStatus(StatusModel):
    """Where the verified artifact lives."""

    claim_name: str | None = Field(default=None, description="The cache PVC.")
    path: str | None = Field(default=None, description="Path of the model inside the PVC.")


class DownloadProgress(StatusModel):
    """How far the fetch Job's download has got (written at most every ~15 s, and at the end)."""

    summary: str = Field(
        max_length=128,
        description="One line for people, e.g. `Downloading 37% 152/410Gi 210MiB/s ETA 22m`.",
    )
    done_bytes: Int64 = Field(
        ge=0, description="Bytes in the cache so far, those a resumed download found included."
    )
    total_bytes: Int64 | None = Field(
        default=None, ge=0,
        description="Bytes in all; unset until the source says (response headers, listing).",
    )
    percent: int | None = Field(default=None, ge=0, le=100, description="doneBytes/totalBytes.")
    bytes_per_second: Int64 | None = Field(
        default=None, ge=0, description="Recent rate (the last 30 s) of this attempt."
    )
    eta_seconds: Int64 | None = Field(
        default=None, ge=0, description="Seconds left at the recent rate."
    )
    resumed_bytes: Int64 = Field(
        default=0, ge=0,
        description="Of doneBytes, what an earlier attempt had left (counted as done).",
    )
    update_time: datetime | None = Field(default=None, description="When this was measured.")


class ModelVersionStatus(StatusModel):
    """What the fetch and verification found."""

    observed_generation: Int64 | None = Field(default=None, ge=0)
    phase: ModelVersionPhase = Field(
        default=ModelVersionPhase.PENDING,
        description="Pending, Fetching, Verifying, Ready or Failed.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=MAX_CONDITIONS,
        description="Verified, Cached, Ready.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    size_bytes: Int64 | None = Field(default=None, ge=0, description="Measured size in bytes.")
    sha256: str | None = Field(
        default=None, max_length=64,
        description="Measured SHA-256 (of the file, or the snapshot digest of a folder).",
    )
    facts: ModelFacts | None = Field(
        default=None,
        description="Facts measured from the GGUF header (safetensors: config.json).",
    )
    cache: CacheStatus | None = Field(default=None, description="Where the artifact is cached.")
    progress: DownloadProgress | None = Field(
        default=None,
        description="The fetch Job's download progress (kubectl get mv: the Progress column).",
    )


class ModelVersion(SpecModel):
    """A ModelVersion object as stored in the API server."""

    model_config = {"extra": "ignore"}

    # One schema, served at both versions (conversion None): either apiVersion reads.
    api_version: str = Field(default=API_VERSION,
                             pattern=f"^{re.escape(GROUP)}/(v1alpha1|v1alpha2)$")
    kind: Literal["ModelVersion"] = "ModelVersion"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ModelVersionSpec
    status: ModelVersionStatus = Field(default_factory=ModelVersionStatus)
