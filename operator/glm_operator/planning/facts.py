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

from collections.abc import Mapping, Sequence
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


def recurrent_layer_count(head_count_kv: Sequence[int], trunk_layers: int) -> int:
    """Recurrent (KDA) layers among the trunk's: a per-block head_count_kv of 0 marks one
    (the nextn blocks past the trunk are attention layers)."""
    return sum(1 for n in list(head_count_kv)[:trunk_layers] if int(n) == 0)


def indexer_layer_count(indexer_types: Sequence[int | bool], trunk_layers: int) -> int:
    """Trunk layers that run the full DSA indexer (GGUF attention.indexer.types true)."""
    return sum(1 for t in list(indexer_types)[:trunk_layers] if t)


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
    # MLA (glm-dsa, glm5-next, deepseek2): the KV cache holds one latent per token and layer,
    # kv_lora_rank values plus the rope_dimension_count rotated ones, and no V (GGUF
    # `attention.kv_lora_rank`, `rope.dimension_count`; HF kv_lora_rank, qk_rope_head_dim).
    kv_lora_rank: int | None = None
    rope_dimension_count: int | None = None
    # DeepSeek sparse attention's lightning indexer (GGUF `attention.indexer.*`): a key cache
    # of indexer_key_length per token in `indexer_layers` layers (None: every attention
    # layer), 3 x as wide with k-pool compression (`indexer.kpool`, glm5-next: key, gate and
    # pooled key per token).
    indexer_head_count: int | None = None
    indexer_key_length: int | None = None
    indexer_kpool: int | None = None
    indexer_layers: int | None = None
    # Hybrid models (glm5-next): trunk layers of KDA linear attention, which hold a fixed
    # recurrent state per sequence instead of KV (GGUF: head_count_kv 0 in the per-layer
    # array; `kda.head_dim`, `ssm.conv_kernel`).
    recurrent_layers: int = 0
    kda_head_dim: int | None = None
    ssm_conv_kernel: int | None = None
    # mHC residual streams (GGUF `hyper_connection.count`): the residual is this many x n_embd.
    hyper_connection_count: int = 0
    # Bytes of the nextn (MTP) layers' tensors in the measured file (the fetch sums them from
    # the GGUF tensor infos); the pinned llama.cpp does not load them.
    nextn_weights_bytes: int | None = None
    # MoE: the leading trunk layers with a dense FFN instead of experts (GGUF
    # `leading_dense_block_count`, HF `first_k_dense_replace`; GLM-4.5: 1, GLM-5: 3). Sizes
    # the routed experts' share of the weights, which expert parallelism splits. Declared
    # only (a facts file) until the API's ModelFacts carries it: without it the DEP plan
    # takes the conservative replicated share (memory.moe_weights).
    leading_dense_block_count: int | None = None

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
                     "value_length", "feed_forward_length", "expert_feed_forward_length",
                     "kv_lora_rank", "indexer_key_length", "indexer_kpool", "kda_head_dim",
                     "ssm_conv_kernel"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 when set, got {value}")
        if self.leading_dense_block_count is not None and not (
                0 <= self.leading_dense_block_count <= self.block_count):
            raise ValueError(
                f"leading_dense_block_count ({self.leading_dense_block_count}) must be within "
                f"the {self.block_count} trunk layers")
        if not 0 <= self.recurrent_layers < self.block_count:
            raise ValueError(
                f"recurrent_layers ({self.recurrent_layers}) must be >= 0 and leave at least one "
                f"attention layer of the {self.block_count}"
            )
        if self.recurrent_layers and not (self.kda_head_dim and self.ssm_conv_kernel):
            raise ValueError("recurrent_layers need kda_head_dim and ssm_conv_kernel")

    @property
    def head_dim_k(self) -> int:
        return self.key_length or self.embedding_length // self.head_count

    @property
    def head_dim_v(self) -> int:
        return self.value_length or self.embedding_length // self.head_count

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def n_embd_k_gqa(self) -> int:
        """K values stored per token per attention layer (llama.cpp's n_embd_k_gqa).

        MLA: the latent and the rotated dims of one KV head (kv_lora_rank + n_rot)."""
        if self.kv_lora_rank is not None:
            return self.kv_lora_rank + (self.rope_dimension_count or 0)
        return self.head_dim_k * self.head_count_kv

    @property
    def n_embd_v_gqa(self) -> int:
        """V values stored per token per attention layer; MLA stores none (V is read from
        the latent K)."""
        if self.kv_lora_rank is not None:
            return 0
        return self.head_dim_v * self.head_count_kv

    @property
    def attention_layers(self) -> int:
        """Trunk layers with a KV cache: all but the recurrent (KDA) ones."""
        return self.block_count - self.recurrent_layers

    @property
    def indexer_row(self) -> int:
        """Indexer cache values per token per indexer layer (0 without an indexer)."""
        if not self.indexer_key_length:
            return 0
        return self.indexer_key_length * (3 if (self.indexer_kpool or 0) > 1 else 1)

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
        cls, metadata: Mapping[str, Any], *, file_size: int | None = None,
        nextn_weights_bytes: int | None = None,
    ) -> ArchitectureFacts:
        """Build from GGUF key/value metadata (`general.architecture`, `<arch>.block_count`, ...).

        `file_size` is the measured artifact size; it becomes `weights_bytes` for the file's
        own quantization (from `general.file_type`). Per-layer integer arrays may be given as
        lists (a head_count_kv of 0 marks a recurrent layer); `nextn_weights_bytes` is what
        the file's nextn layers weigh (the fetch sums their tensor infos).
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
        kv_heads = key("attention.head_count_kv")
        recurrent = 0
        if isinstance(kv_heads, list | tuple):
            recurrent = recurrent_layer_count(kv_heads, block_count)
            kv_heads = max(kv_heads, default=None)
        head_count_kv = int(kv_heads or head_count)
        indexer_types = key("attention.indexer.types")
        indexer_layers = (
            indexer_layer_count(indexer_types, block_count)
            if isinstance(indexer_types, list | tuple) else None
        )
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
            kv_lora_rank=optional("attention.kv_lora_rank"),
            rope_dimension_count=(
                int(key("rope.dimension_count")) if key("rope.dimension_count") is not None
                else None
            ),
            indexer_head_count=optional("attention.indexer.head_count"),
            indexer_key_length=optional("attention.indexer.key_length"),
            indexer_kpool=optional("attention.indexer.kpool"),
            indexer_layers=indexer_layers,
            recurrent_layers=recurrent,
            kda_head_dim=optional("kda.head_dim"),
            ssm_conv_kernel=optional("ssm.conv_kernel"),
            hyper_connection_count=int(key("hyper_connection.count") or 0),
            nextn_weights_bytes=nextn_weights_bytes or None,
        )
