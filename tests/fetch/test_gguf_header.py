from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest
from gguf_files import MakeGGUF
from glm_operator.fetch.gguf_header import GGUFFormatError, read_gguf_file, read_gguf_header


def test_glm4_header_facts(make_gguf: MakeGGUF) -> None:
    facts = read_gguf_file(make_gguf("glm4"))
    assert facts.architecture == "glm4"
    assert facts.name == "test-glm4"
    assert (facts.block_count, facts.context_length, facts.embedding_length) == (40, 131072, 4096)
    assert (facts.head_count, facts.head_count_kv) == (32, 2)
    assert (facts.key_length, facts.value_length) == (128, 128)
    assert (facts.feed_forward_length, facts.expert_feed_forward_length) == (13696, None)
    assert facts.nextn_predict_layers is None and facts.expert_count is None
    assert facts.file_type_name == "Q4_K_M"
    assert facts.version == 3 and facts.tensor_count == 2


def test_glm4moe_header_has_moe_and_nextn(make_gguf: MakeGGUF) -> None:
    facts = read_gguf_file(make_gguf("glm4moe"))
    assert facts.architecture == "glm4moe"
    assert facts.block_count == 47
    assert facts.nextn_predict_layers == 1
    assert (facts.expert_count, facts.expert_used_count) == (128, 8)
    assert (facts.feed_forward_length, facts.expert_feed_forward_length) == (10944, 1408)


def test_llama_header_without_optional_keys(make_gguf: MakeGGUF) -> None:
    facts = read_gguf_file(make_gguf("llama"))
    assert facts.architecture == "llama"
    assert facts.key_length is None and facts.value_length is None
    assert facts.feed_forward_length is None


def test_tensor_data_bytes_is_the_rest_of_the_file(make_gguf: MakeGGUF) -> None:
    path = make_gguf("llama", tensors=3)
    facts = read_gguf_file(path)
    assert facts.data_offset % facts.alignment == 0
    # three float32 4x8 tensors, each aligned to 32 bytes: 3 * 128 bytes
    assert facts.tensor_data_bytes == path.stat().st_size - facts.data_offset == 3 * 128


def test_per_layer_array_takes_the_largest(make_gguf: MakeGGUF) -> None:
    keys = {"block_count": 3, "attention.head_count_kv": [2, 4, 8]}
    facts = read_gguf_file(make_gguf("llama", keys=keys))
    assert facts.head_count_kv == 8


def test_matches_the_gguf_package_reader(make_gguf: MakeGGUF) -> None:
    import gguf

    path = make_gguf("glm4moe")
    reference = gguf.GGUFReader(str(path))
    facts = read_gguf_file(path)
    assert facts.tensor_count == len(reference.tensors)
    assert facts.kv_count == len(reference.fields) - 3  # the reader lists magic/version/counts
    assert facts.data_offset == reference.data_offset


def test_large_vocabulary_is_skipped_not_decoded(make_gguf: MakeGGUF,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The 150,000 token strings are stepped over by their lengths, never decoded (the
    header of a real GLM GGUF has this many): counted, not timed."""
    from glm_operator.fetch import gguf_header

    decoded = []
    real_string = gguf_header._Reader.string

    def counting_string(self: gguf_header._Reader, what: str) -> str:
        decoded.append(what)
        return real_string(self, what)
    monkeypatch.setattr(gguf_header._Reader, "string", counting_string)
    path = make_gguf("glm4", vocab=150_000)
    facts = read_gguf_file(path)
    assert facts.architecture == "glm4"
    assert len(decoded) < 200, f"{len(decoded)} strings decoded"


def test_header_is_read_without_the_tensor_data(make_gguf: MakeGGUF, tmp_path: Path) -> None:
    # Only the header: the parser must not need a single byte of tensor data.
    path = make_gguf("glm4")
    facts = read_gguf_file(path)
    head = path.read_bytes()[: facts.data_offset]
    again = read_gguf_header(io.BytesIO(head))
    assert again.architecture == "glm4" and again.block_count == 40
    assert again.tensor_data_bytes is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"GGML" + b"\0" * 20, "not a GGUF file"),
        (b"GGUF" + struct.pack("<I", 1) + b"\0" * 16, "version 1 is obsolete"),
        (b"GGUF" + struct.pack("<I", 9) + b"\0" * 16, "unsupported GGUF version 9"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1), "truncated"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 10**15), "implausible counts"),
        (b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 2**40), "not plausible"),
        (b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1) + b"k" + struct.pack("<I", 42),
         "unknown value type 42"),
        (b"", "truncated"),
    ],
)
def test_corrupt_headers_fail_clearly(data: bytes, message: str) -> None:
    with pytest.raises(GGUFFormatError, match=message):
        read_gguf_header(io.BytesIO(data), len(data))


def test_truncated_real_file(make_gguf: MakeGGUF) -> None:
    data = make_gguf("glm4").read_bytes()[:200]
    with pytest.raises(GGUFFormatError, match="truncated"):
        read_gguf_header(io.BytesIO(data), len(data))


def test_nextn_tensor_bytes_and_per_layer_arrays(tmp_path: Path) -> None:
    """The header reader sums the nextn block's tensor bytes (the pinned llama.cpp skips
    them) and keeps the architecture's per-layer integer arrays (0 KV heads: a KDA layer)."""
    import gguf
    import numpy as np

    path = tmp_path / "hybrid.gguf"
    writer = gguf.GGUFWriter(str(path), "glm5-next")
    writer.add_block_count(3)
    writer.add_uint32("glm5-next.nextn_predict_layers", 1)
    writer.add_array("glm5-next.attention.head_count_kv", [0, 1, 1])
    writer.add_tensor("blk.1.attn_norm.weight", np.ones(64, dtype=np.float32))
    writer.add_tensor("blk.2.attn_norm.weight", np.ones(64, dtype=np.float32))  # f32: 256 B
    q8_0 = gguf.GGMLQuantizationType.Q8_0
    blocks = gguf.quants.quantize(np.ones((4, 64), dtype=np.float32), q8_0)
    writer.add_tensor("blk.2.ffn_up.weight", blocks, raw_dtype=q8_0)  # 4 x 2 blocks of 34 B
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    facts = read_gguf_file(path)
    assert facts.nextn_tensor_bytes == 256 + 8 * 34
    assert facts.arrays == {"glm5-next.attention.head_count_kv": [0, 1, 1]}
    assert facts.head_count_kv == 1
