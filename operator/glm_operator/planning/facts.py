"""What the planner knows about a model: architecture numbers and weight sizes.

`ArchitectureFacts` is filled from a GGUF header (measured by the fetch Job into ModelVersion
status), from facts declared in a ModelVersion spec, or from a JSON file for
`glm-operator plan --gguf-facts`. It carries no engine or hardware assumption.

Layer convention: `block_count` is the number of trunk decoder layers (Hugging Face
`num_hidden_layers`). Multi-token-prediction layers (GLM-4.5 "nextn") are counted apart in
`nextn_predict_layers`. A glm4moe GGUF header's `block_count` already includes them;
`from_gguf_metadata` subtracts them so the two sources mean the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from glm_operator.layers import trunk_layers

# llama.cpp's `general.file_type` (enum llama_ftype) -> the quantization name users type.
GGUF_FILE_TYPES: dict[int, str] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
}



@dataclass(frozen=True)
class ArchitectureFacts:
    """Architecture numbers of one model, independent of engine and hardware."""

    architecture: str
    block_count: int
    embedding_length: int
    head_count: int
    head_count_kv: int
    context_length: int
    # FFN intermediate width (HF intermediate_size); for MoE the dense layers' width, or the
    # experts' width when the model has no dense layers and no separate expert width.
    feed_forward_length: int | None = None
    # One expert's FFN width (HF moe_intermediate_size).
    expert_feed_forward_length: int | None = None
    key_length: int | None = None  # per-head K width; default embedding_length / head_count
    value_length: int | None = None  # per-head V width; default embedding_length / head_count
    nextn_predict_layers: int = 0
    expert_count: int = 0
    expert_used_count: int = 0
    parameter_count: int | None = None  # total parameters (all experts)
    active_parameter_count: int | None = None  # per token, for MoE
    vocab_size: int | None = None
    weights_bytes: int | None = None  # measured size of the artifact in `quantization`
    quantization: str | None = None  # what `weights_bytes` was measured for (Q4_K_M, fp8, ...)
    tied_embeddings: bool = False

    def __post_init__(self) -> None:
        for name in ("block_count", "embedding_length", "head_count", "head_count_kv"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.context_length <= 0:
            raise ValueError(f"context_length must be > 0, got {self.context_length}")
        if self.head_count % self.head_count_kv:
            raise ValueError(
                f"head_count ({self.head_count}) must be a multiple of "
                f"head_count_kv ({self.head_count_kv})"
            )
        if self.nextn_predict_layers < 0:
            raise ValueError("nextn_predict_layers must be >= 0")
        for name in ("weights_bytes", "parameter_count", "vocab_size", "key_length",
                     "value_length", "feed_forward_length", "expert_feed_forward_length"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 when set, got {value}")

    @property
    def head_dim_k(self) -> int:
        return self.key_length or self.embedding_length // self.head_count

    @property
    def head_dim_v(self) -> int:
        return self.value_length or self.embedding_length // self.head_count

    @property
    def n_embd_k_gqa(self) -> int:
        """K values stored per token per layer (llama.cpp's n_embd_k_gqa)."""
        return self.head_dim_k * self.head_count_kv

    @property
    def n_embd_v_gqa(self) -> int:
        return self.head_dim_v * self.head_count_kv

    @property
    def is_moe(self) -> bool:
        return self.expert_count > 0

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> ArchitectureFacts:
        """Build from a plain mapping (JSON facts file, declared spec facts); unknown keys fail."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown model fact(s): {', '.join(unknown)}")
        return cls(**dict(data))

    @classmethod
    def from_gguf_metadata(
        cls, metadata: Mapping[str, Any], *, file_size: int | None = None
    ) -> ArchitectureFacts:
        """Build from GGUF key/value metadata (`general.architecture`, `<arch>.block_count`, ...).

        `file_size` is the measured artifact size; it becomes `weights_bytes` for the file's
        own quantization (from `general.file_type`).
        """
        arch = str(metadata["general.architecture"])

        def key(name: str) -> Any:
            return metadata.get(f"{arch}.{name}")

        def optional(name: str) -> int | None:
            # Per-layer arrays (some architectures vary the FFN width) give their largest value.
            value = key(name)
            if isinstance(value, list | tuple):
                value = max(value, default=None)
            return int(value) if value else None

        def required(name: str) -> int:
            value = key(name)
            if value is None:
                raise ValueError(f"GGUF metadata lacks {arch}.{name}")
            return int(value)

        nextn = int(key("nextn_predict_layers") or 0)
        block_count = trunk_layers(arch, required("block_count"), nextn)
        head_count = required("attention.head_count")
        head_count_kv = int(key("attention.head_count_kv") or head_count)
        vocab = key("vocab_size")
        if vocab is None and "tokenizer.ggml.tokens" in metadata:
            vocab = len(metadata["tokenizer.ggml.tokens"])
        file_type = metadata.get("general.file_type")
        quantization = GGUF_FILE_TYPES.get(int(file_type)) if file_type is not None else None
        key_length = key("attention.key_length")
        value_length = key("attention.value_length")
        return cls(
            architecture=arch,
            block_count=block_count,
            embedding_length=required("embedding_length"),
            head_count=head_count,
            head_count_kv=head_count_kv,
            context_length=required("context_length"),
            feed_forward_length=optional("feed_forward_length"),
            expert_feed_forward_length=optional("expert_feed_forward_length"),
            key_length=int(key_length) if key_length else None,
            value_length=int(value_length) if value_length else None,
            nextn_predict_layers=nextn,
            expert_count=int(key("expert_count") or 0),
            expert_used_count=int(key("expert_used_count") or 0),
            vocab_size=int(vocab) if vocab else None,
            weights_bytes=file_size,
            quantization=quantization,
        )
