"""Model facts of a safetensors snapshot: Hugging Face config.json plus the safetensors headers.

config.json key                            -> status.facts (GGUF vocabulary, as for a GGUF file)
  architectures[0] / model_type            -> architecture, as llama.cpp names it (table below)
  num_hidden_layers (+ nextn, see below)   -> blockCount
  hidden_size                              -> embeddingLength
  num_attention_heads                      -> headCount
  num_key_value_heads                      -> headCountKv
  head_dim                                 -> keyLength, valueLength
  max_position_embeddings                  -> contextLength
  num_nextn_predict_layers                 -> nextnPredictLayers
  n_routed_experts | num_experts | num_local_experts -> expertCount
  num_experts_per_tok                      -> expertUsedCount
  vocab_size                               -> vocabSize
MLA models (kv_lora_rank set: GLM-5 GlmMoeDsaForCausalLM, glm5-next, DeepSeek V2/V3), as
llama.cpp's converter writes them:
  kv_lora_rank                             -> kvLoraRank; headCountKv 1, keyLength
                                              kv_lora_rank + qk_rope_head_dim, valueLength
                                              kv_lora_rank (one latent head, no V)
  qk_rope_head_dim (x partial_rotary_factor for glm-dsa) -> ropeDimensionCount
  index_n_heads, index_head_dim, index_kpool -> indexerHeadCount, indexerKeyLength,
                                              indexerKpool
  indexer_types ("full"/"shared")          -> indexerTypes (true: full)
  hc_mult                                  -> hyperConnectionCount
  glm5-next: layer_types                   -> headCountKvPerLayer (0: linear_attention)
             linear_attn_config.head_dim, .short_conv_kernel_size -> kdaHeadDim,
                                              ssmConvKernel
ChatGLM's own names (num_layers, seq_length, multi_query_group_num, kv_channels,
padded_vocab_size) are read when the standard ones are absent, and a multimodal config's
`text_config` when the top level has no layers.

The architecture is the GGUF name (glm4, glm4moe, ...), not the transformers class name,
so measured facts mean the same whatever the format: the planner's layer convention and the
vLLM GLM tool/reasoning parser key off it, and spec.architecture is compared with it. For
the same reason blockCount counts the nextn (MTP) layers for the architectures whose GGUF
block_count does (glm4moe, glm-dsa, glm5-next, deepseek2), exactly as llama.cpp's converter
writes it; the planner subtracts them again.

parameterCount is summed from the tensor shapes in each *.safetensors header (8-byte
little-endian length, then JSON), which is what the weights really hold.
"""

from __future__ import annotations

import json
import logging
import math
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from glm_operator.api.modelversion import ModelFacts
from glm_operator.layers import gguf_block_count

log = logging.getLogger("glm_operator.fetch")

# transformers class (config.json architectures[0]) -> llama.cpp architecture name.
HF_TO_GGUF_ARCHITECTURE: dict[str, str] = {
    "Glm4ForCausalLM": "glm4",
    "Glm4MoeForCausalLM": "glm4moe",
    "GlmMoeDsaForCausalLM": "glm-dsa",
    "Glm5NextForCausalLM": "glm5-next",  # vLLM 0.33's registry
    "Glm5NextForConditionalGeneration": "glm5-next",  # llama.cpp's converter, transformers
    "Glm4MoeLiteForCausalLM": "deepseek2",
    "GlmForCausalLM": "chatglm",
    "ChatGLMModel": "chatglm",
    "ChatGLMForConditionalGeneration": "chatglm",
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen2MoeForCausalLM": "qwen2moe",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3moe",
    "DeepseekV2ForCausalLM": "deepseek2",
    "DeepseekV3ForCausalLM": "deepseek2",
}
_SAFETENSORS_HEADER_LIMIT = 100 * 2**20  # the format's own cap on the JSON header


def _first(config: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        value = config.get(name)
        if value is not None:
            return value
    return None


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def architecture_names(config: Mapping[str, Any]) -> tuple[str | None, list[str]]:
    """(GGUF-style architecture, every name config.json gives for it)."""
    classes = [a for a in (config.get("architectures") or []) if isinstance(a, str)]
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    names = [*classes, *([model_type] if model_type else [])]
    for cls in classes:
        if cls in HF_TO_GGUF_ARCHITECTURE:
            return HF_TO_GGUF_ARCHITECTURE[cls], [HF_TO_GGUF_ARCHITECTURE[cls], *names]
    return (model_type or (classes[0] if classes else None)), names


def _normal(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "").replace(".", "")


def architecture_matches(expected: str, names: Iterable[str]) -> bool:
    """spec.architecture against config.json's names, ignoring case, '_', '-' and '.'."""
    return any(_normal(expected) == _normal(n) for n in names)


def facts_from_config(config: Mapping[str, Any], size_bytes: int | None = None,
                      parameter_count: int | None = None) -> ModelFacts:
    text = config.get("text_config")
    if isinstance(text, Mapping) and _first(config, "num_hidden_layers", "num_layers") is None:
        config = {**config, **text}
    architecture, _ = architecture_names(config)
    layers = _int(_first(config, "num_hidden_layers", "num_layers", "n_layer"))
    nextn = _int(config.get("num_nextn_predict_layers"))
    if layers is not None and nextn:
        layers = gguf_block_count(architecture or "", layers, nextn)
    head_dim = _int(_first(config, "head_dim", "kv_channels"))
    values: dict[str, Any] = {
        "architecture": architecture,
        "block_count": layers,
        "embedding_length": _int(_first(config, "hidden_size", "n_embd", "d_model")),
        "head_count": _int(_first(config, "num_attention_heads", "n_head")),
        "head_count_kv": _int(_first(config, "num_key_value_heads", "multi_query_group_num")),
        "key_length": head_dim,
        "value_length": head_dim,
        "context_length": _int(_first(config, "max_position_embeddings", "seq_length",
                                      "n_positions")),
        "nextn_predict_layers": nextn,
        "expert_count": _int(_first(config, "n_routed_experts", "num_experts",
                                    "num_local_experts")),
        "expert_used_count": _int(config.get("num_experts_per_tok")),
        "vocab_size": _int(_first(config, "vocab_size", "padded_vocab_size")),
        # FFN widths: the compute buffers, and the routed experts' share of the weights that
        # expert parallelism splits (planning/memory.py moe_weights)
        "feed_forward_length": _int(_first(config, "intermediate_size", "ffn_hidden_size")),
        "expert_feed_forward_length": _int(config.get("moe_intermediate_size")),
        "parameter_count": parameter_count or None,
        "size_bytes": size_bytes or None,
    }
    values.update(_mla_facts(config, architecture, layers))
    return facts_within_bounds(values, "config.json")


def _mla_facts(config: Mapping[str, Any], architecture: str | None,
               block_count: int | None) -> dict[str, Any]:
    """MLA, DSA indexer, KDA and mHC settings, written as llama.cpp's converter writes them
    (conversion/deepseek.py DeepseekV2Model, conversion/glm.py GlmMoeDsaModel and
    Glm5NextModel of the pinned tree): one latent KV head whose key is kv_lora_rank +
    qk_rope_head_dim wide and whose value is the latent; per-layer indexer types (true:
    "full"); head_count_kv per block, 0 for a linear_attention (KDA) layer and 1 for the
    attention and nextn blocks."""
    kv_lora_rank = _int(config.get("kv_lora_rank"))
    if kv_lora_rank is None or not _within_bounds("kv_lora_rank", kv_lora_rank):
        return {}  # read as attention heads (GQA): more KV than MLA keeps, never less
    qk_rope = _int(config.get("qk_rope_head_dim")) or 0
    rope = qk_rope
    if architecture == "glm-dsa":  # GlmMoeDsaModel scales by the partial rotary factor
        rope_parameters = config.get("rope_parameters")
        factor = _first(rope_parameters if isinstance(rope_parameters, Mapping) else {},
                        "partial_rotary_factor") or config.get("partial_rotary_factor") or 1.0
        rope = int(qk_rope * factor) if isinstance(factor, int | float) else qk_rope
    values: dict[str, Any] = {
        "head_count_kv": 1,  # MLA is converted to MQA: one latent head
        "key_length": kv_lora_rank + qk_rope,
        "value_length": kv_lora_rank,
        "kv_lora_rank": kv_lora_rank,
        "rope_dimension_count": rope,
        "indexer_head_count": _int(config.get("index_n_heads")),
        "indexer_key_length": _int(config.get("index_head_dim")),
        "indexer_kpool": _int(config.get("index_kpool")),
        "indexer_types": _indexer_types(config),
        "hyper_connection_count": _int(config.get("hc_mult")),
    }
    if architecture == "glm5-next":
        values.update(_kda_facts(config, block_count))
    return values


def _within_bounds(name: str, value: Any) -> bool:
    try:
        ModelFacts.model_validate({name: value})
    except ValidationError:
        return False
    return True


def _indexer_types(config: Mapping[str, Any]) -> list[bool] | None:
    """indexer_types ("full" runs the indexer, "shared" reuses the previous full layer's
    top-k), else the schedule transformers derives (GlmMoeDsaConfig / Glm5NextTextConfig
    __post_init__): index_topk_pattern ("FSSF..."), else index_topk_freq and
    index_skip_topk_offset (2). None when every layer is full (the default)."""
    if config.get("index_head_dim") is None:
        return None
    layers = _int(_first(config, "num_hidden_layers", "num_layers"))
    types = config.get("indexer_types")
    pattern = config.get("index_topk_pattern")
    if isinstance(types, list) and all(isinstance(t, str) for t in types):
        full = [t == "full" for t in types]
    elif isinstance(pattern, str) and set(pattern) <= {"F", "S"}:
        full = [c == "F" for c in pattern]
    elif isinstance(pattern, list) and all(isinstance(t, str) for t in pattern):
        full = [t == "full" for t in pattern]
    else:
        freq = max(_int(config.get("index_topk_freq")) or 1, 1)
        offset = _int(config.get("index_skip_topk_offset"))
        offset = 2 if offset is None else offset
        if layers is None or freq == 1:
            return None
        full = [max(i - offset + 1, 0) % freq == 0 for i in range(layers)]
    return None if not full or all(full) else full


def _kda_facts(config: Mapping[str, Any], block_count: int | None) -> dict[str, Any]:
    """glm5-next's linear attention: layer_types (transformers' default when absent: every
    layer but each fourth is linear_attention), linear_attn_config's head_dim and
    short_conv_kernel_size (or the flat linear_head_dim, linear_conv_kernel_dim)."""
    layers = _int(_first(config, "num_hidden_layers", "num_layers"))
    if layers is None:
        return {}
    layer_types = config.get("layer_types")
    if not (isinstance(layer_types, list) and len(layer_types) == layers):
        layer_types = ["linear_attention" if i % 4 != 3 else "indexed_attention"
                       for i in range(layers)]
    per_block = [0 if t == "linear_attention" else 1 for t in layer_types]
    per_block += [1] * max((block_count or layers) - layers, 0)  # the nextn blocks
    linear = config.get("linear_attn_config")
    linear = linear if isinstance(linear, Mapping) else {}
    return {
        "head_count_kv_per_layer": per_block,
        "kda_head_dim": _int(_first(linear, "head_dim")) or _int(config.get("linear_head_dim")),
        "ssm_conv_kernel": (_int(_first(linear, "short_conv_kernel_size"))
                            or _int(config.get("linear_conv_kernel_dim"))),
    }


def facts_within_bounds(values: Mapping[str, Any], source: str) -> ModelFacts:
    """ModelFacts of `values` (snake_case names, None for unknown). A value the API would
    refuse (out of range, a list too long) is dropped with a warning naming it, not fatal:
    the remaining facts still plan better than none."""
    values = {k: v for k, v in values.items() if v is not None}
    for _ in range(len(values) + 1):
        try:
            return ModelFacts.model_validate(values)
        except ValidationError as exc:
            bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
            if not bad & set(values):
                raise
            for name in bad & set(values):
                log.warning("%s: ignoring %s=%r (%s)", source, name, values.pop(name),
                            "outside the API's range")
    return ModelFacts()


def read_config(path: Path) -> dict[str, Any] | None:
    """config.json as a dict; None when absent or not a JSON object (logged)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        log.warning("%s is not valid JSON (%s); no facts from it", path, exc)
        return None
    return data if isinstance(data, dict) else None


def safetensors_parameter_count(path: Path) -> int:
    """Elements of every tensor in one .safetensors file, from its header alone."""
    with path.open("rb") as handle:
        raw = handle.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path.name}: shorter than a safetensors header")
        (length,) = struct.unpack("<Q", raw)
        if length > _SAFETENSORS_HEADER_LIMIT:
            raise ValueError(f"{path.name}: header length {length} is not plausible")
        header = json.loads(handle.read(length))
    if not isinstance(header, dict):
        raise ValueError(f"{path.name}: header is not a JSON object")
    total = 0
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        shape = tensor.get("shape") if isinstance(tensor, dict) else None
        if not isinstance(shape, list):
            raise ValueError(f"{path.name}: tensor {name!r} has no shape")
        total += math.prod(int(d) for d in shape)
    return total
