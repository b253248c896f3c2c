"""The MLA, indexer, KDA and mHC facts of a measured GGUF header reach the operator's plans:
GGUF file -> the fetch Job's status.facts (fetch/reporter.py) -> ModelVersion -> from_api ->
ArchitectureFacts, equal to what `ArchitectureFacts.from_gguf_metadata` makes of the same
header read by the gguf package (what `glm-operator plan --gguf-facts` and the e2e tests use).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from glm_operator.api.modelversion import ModelVersion, ModelVersionStatus
from glm_operator.fetch.gguf_header import read_gguf_file
from glm_operator.fetch.reporter import facts_from_gguf
from glm_operator.planning import memory as mem
from glm_operator.planning.facts import ArchitectureFacts
from glm_operator.planning.from_api import ModelFactsUnknown, model_facts_for

from e2e.glm_models import GLM_SPECS, write_glm_model


def _reference(path: Path) -> ArchitectureFacts:
    """from_gguf_metadata over the gguf package's own reading of the header."""
    reader = gguf.GGUFReader(str(path))
    metadata: dict[str, Any] = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "tokenizer.ggml.tokens":
            continue
        value = field.contents()
        if isinstance(value, list) and value and isinstance(value[0], bool):
            value = [int(v) for v in value]
        metadata[name] = value
    nextn_bytes = _nextn_tensor_bytes(reader, metadata)
    return ArchitectureFacts.from_gguf_metadata(metadata, file_size=path.stat().st_size,
                                                nextn_weights_bytes=nextn_bytes)


def _nextn_tensor_bytes(reader: gguf.GGUFReader, metadata: dict[str, Any]) -> int | None:
    arch = metadata["general.architecture"]
    blocks, nextn = metadata[f"{arch}.block_count"], metadata.get(f"{arch}.nextn_predict_layers")
    if not nextn:
        return None
    prefixes = tuple(f"blk.{i}." for i in range(blocks - nextn, blocks))
    return sum(int(t.n_bytes) for t in reader.tensors if t.name.startswith(prefixes)) or None


def _model_version(status_facts: dict[str, Any], size: int) -> ModelVersion:
    return ModelVersion.model_validate({
        "metadata": {"name": "mv", "namespace": "ns"},
        "spec": {"source": {"uri": "hf://org/repo/model.gguf"}, "format": "gguf"},
        "status": {"phase": "Ready", "sizeBytes": size, "facts": status_facts},
    })


def _through_the_status(path: Path) -> tuple[dict[str, Any], ArchitectureFacts]:
    size = path.stat().st_size
    status_facts = facts_from_gguf(read_gguf_file(path), size)
    ModelVersionStatus.model_validate({"facts": status_facts})  # what the API server stores
    return status_facts, model_facts_for(_model_version(status_facts, size))


def _glm5_header(path: Path, **changes: Any) -> Path:
    """A header of GLM-5's shape as llama.cpp's converter writes it (GlmMoeDsaModel): the
    numbers of transformers' GlmMoeDsaConfig defaults (checkpoint zai-org/GLM-5, in the
    vLLM 0.33.0 venv) - 78 trunk layers + 1 nextn block, hidden 6144, 64 heads, one latent
    KV head of kv_lora_rank 512 + qk_rope_head_dim 64, indexer 32 heads x 128. The
    indexer.types pattern (full on even layers) exercises the bool array; GLM-5's own
    default runs the full indexer everywhere. Tiny tensors stand in for the weights, two of
    them in the nextn block (blk.78)."""
    arch = "glm-dsa"
    keys: dict[str, Any] = {
        "block_count": 79, "nextn_predict_layers": 1, "context_length": 202752,
        "embedding_length": 6144, "feed_forward_length": 12288, "attention.head_count": 64,
        "attention.head_count_kv": 1, "attention.key_length": 576,
        "attention.value_length": 512, "attention.key_length_mla": 256,
        "attention.value_length_mla": 256, "attention.q_lora_rank": 2048,
        "attention.kv_lora_rank": 512, "rope.dimension_count": 64,
        "expert_count": 256, "expert_used_count": 8, "expert_feed_forward_length": 2048,
        "vocab_size": 154880, "attention.indexer.head_count": 32,
        "attention.indexer.key_length": 128, "attention.indexer.top_k": 2048,
        "attention.indexer.types": [i % 2 == 0 for i in range(78)],
        **changes,
    }  # fmt: skip
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_K_M))
    for key, value in keys.items():
        if isinstance(value, list):
            writer.add_array(f"{arch}.{key}", value)
        else:
            writer.add_uint32(f"{arch}.{key}", value)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(64, dtype=np.float32))
    writer.add_tensor("blk.78.attn_norm.weight", np.ones(64, dtype=np.float32))
    writer.add_tensor("blk.78.ffn_norm.weight", np.ones(32, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("arch", ["glm-dsa", "glm5-next"])
def test_the_tiny_models_facts_survive_the_status(tmp_path: Path, arch: str) -> None:
    """The tiny GGUFs the e2e tests load into the real llama-server (e2e/glm_models.py)."""
    path = write_glm_model(tmp_path / f"{arch}.gguf", GLM_SPECS[arch])
    status_facts, planned = _through_the_status(path)
    reference = _reference(path)
    assert planned == reference
    assert planned.kv_lora_rank == 128 and planned.n_embd_v_gqa == 0
    assert planned.nextn_weights_bytes and status_facts["nextnWeightsBytes"] == \
        planned.nextn_weights_bytes
    if arch == "glm5-next":
        # head_count_kv per block [0, 0, 1, 0, 0, 1, 1]: 4 KDA layers of the 6 trunk ones
        assert status_facts["headCountKvPerLayer"] == [0, 0, 1, 0, 0, 1, 1]
        assert (planned.recurrent_layers, planned.attention_layers) == (4, 2)
        assert (planned.kda_head_dim, planned.ssm_conv_kernel) == (32, 4)
        assert (planned.indexer_kpool, planned.hyper_connection_count) == (4, 4)
        assert planned.rope_dimension_count == 0


def test_a_glm5_header_plans_mla_kv_through_the_operator(tmp_path: Path) -> None:
    path = _glm5_header(tmp_path / "glm5.gguf")
    status_facts, planned = _through_the_status(path)
    assert planned == _reference(path)
    assert status_facts["indexerTypes"] == [i % 2 == 0 for i in range(78)]
    assert (planned.kv_lora_rank, planned.rope_dimension_count, planned.indexer_layers) == (
        512, 64, 39)
    # llama.cpp, f16: 78 trunk layers x 576 latent values + 39 indexer layers x 128 keys,
    # 2 bytes each = 78 x 1152 + 39 x 256 = 89856 + 9984 = 99840 bytes per token (a GQA
    # reading of 64 heads x 192 K + 256 V would be 78 x 64 x 448 x 2 = 4472832).
    assert mem.kv_bytes_per_token(planned, "f16", "f16", nextn=False) == 99840
    # the nextn block's two tensors: 64 f32 + 32 f16 = 320 bytes, not loaded by llama.cpp
    assert planned.nextn_weights_bytes == 320


def test_declared_facts_take_the_same_fields(tmp_path: Path) -> None:
    """spec.facts of a glm5-next safetensors model declared by hand (trunk blockCount)."""
    mv = ModelVersion.model_validate({
        "metadata": {"name": "mv", "namespace": "ns"},
        "spec": {"source": {"uri": "hf://org/repo"}, "format": "safetensors",
                 "quantization": "bf16", "architecture": "glm5-next",
                 "facts": {"blockCount": 8, "embeddingLength": 4096, "headCount": 32,
                           "headCountKv": 1, "contextLength": 131072, "kvLoraRank": 512,
                           "ropeDimensionCount": 0, "indexerKeyLength": 128,
                           "indexerKpool": 16, "kdaHeadDim": 128, "ssmConvKernel": 4,
                           "hyperConnectionCount": 4,
                           "headCountKvPerLayer": [0, 0, 0, 1, 0, 0, 0, 1, 1],
                           "indexerTypes": [True, False]}},
    })
    facts = model_facts_for(mv)
    assert (facts.recurrent_layers, facts.attention_layers, facts.indexer_layers) == (6, 2, 1)
    # f16: 2 layers x 512 latent + 1 indexer layer x 3 x 128 (k-pool: key, gate, pooled)
    assert mem.kv_bytes_per_token(facts, "f16", "f16", nextn=False) == (2 * 512 + 384) * 2


def test_recurrent_layers_without_their_sizes_are_refused() -> None:
    status = {"architecture": "glm5-next", "blockCount": 3, "embeddingLength": 64,
              "headCount": 4, "headCountKv": 1, "contextLength": 4096, "kvLoraRank": 32,
              "headCountKvPerLayer": [0, 1, 1], "nextnPredictLayers": 1}
    with pytest.raises(ModelFactsUnknown, match="kda_head_dim and ssm_conv_kernel"):
        model_facts_for(_model_version(status, 1000))


def test_hostile_header_values_are_left_out(tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """A header value the API would refuse is dropped with a warning naming it; the other
    facts are still reported (the planner then refuses or plans with what is left)."""
    path = _glm5_header(tmp_path / "bad.gguf", **{
        "attention.kv_lora_rank": 10**7, "hyper_connection.count": 100000,
        "attention.indexer.types": [True] * 1500,
    })
    with caplog.at_level(logging.WARNING, "glm_operator.fetch"):
        status_facts = facts_from_gguf(read_gguf_file(path), path.stat().st_size)
    assert "kvLoraRank" not in status_facts and "hyperConnectionCount" not in status_facts
    assert "indexerTypes" not in status_facts  # over 1024 entries: not cut, left out
    assert status_facts["indexerKeyLength"] == 128 and status_facts["blockCount"] == 79
    assert "kv_lora_rank=10000000" in caplog.text
