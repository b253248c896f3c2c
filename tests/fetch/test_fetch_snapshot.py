"""Folder (safetensors snapshot) fetches: URI parsing, listing rules, digest, facts, status."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from glm_operator.api.modelversion import ModelVersion, ModelVersionStatus
from glm_operator.fetch.errors import InvalidModelFile, InvalidSourceURI, SourceNotFound
from glm_operator.fetch.hf_config import (
    architecture_matches,
    architecture_names,
    facts_from_config,
    safetensors_parameter_count,
)
from glm_operator.fetch.listing import DEFAULT_INCLUDE, RemoteFile, _s3_query, _select
from glm_operator.fetch.reporter import StatusTarget, success_status
from glm_operator.fetch.snapshot import (
    ManifestEntry,
    SnapshotResult,
    sha256sums_text,
    snapshot_digest,
)
from glm_operator.fetch.sources import (
    HttpSource,
    HubRepository,
    S3Prefix,
    SourceSettings,
    is_directory_uri,
    parse_directory_source,
)
from glm_operator.planning.from_api import model_facts_for

GLM45_AIR = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
    "num_hidden_layers": 46, "num_nextn_predict_layers": 1, "hidden_size": 4096,
    "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 131072, "n_routed_experts": 128, "num_experts_per_tok": 8,
    "vocab_size": 151552,
}


@pytest.mark.parametrize(("uri", "directory"), [
    ("hf://zai-org/GLM-4-32B-0414?revision=main", True),
    ("hf://zai-org/GLM-4-32B-0414", True),
    ("hf://zai-org/GLM-4-32B-0414/model.gguf", False),
    ("s3://models/zai-org/GLM-4-9B-0414/", True),
    ("s3://models/", True),
    ("s3://models/zai-org/GLM-4-9B-0414/model.gguf", False),
    ("https://h/dir/", False),
])
def test_which_uris_name_a_folder(uri: str, directory: bool) -> None:
    assert is_directory_uri(uri) is directory


def test_hub_repository_and_its_names() -> None:
    source = parse_directory_source("hf://zai-org/GLM-4-32B-0414?revision=v1.0",
                                    SourceSettings(hf_token="hf_x"))
    assert isinstance(source, HubRepository)
    assert (source.org, source.repo, source.revision) == ("zai-org", "GLM-4-32B-0414", "v1.0")
    # The directory name is what render/pod.py's model_relative_path derives from the URI.
    assert source.dirname == "GLM-4-32B-0414"
    api = source.api_source("tree/abc", "recursive=true")
    assert api.url == "https://huggingface.co/api/models/zai-org/GLM-4-32B-0414/tree/abc?recursive=true"
    assert api.request_headers("GET", {})["Authorization"] == "Bearer hf_x"
    assert source.file_source("abc", "sub dir/x.json").url == (
        "https://huggingface.co/zai-org/GLM-4-32B-0414/resolve/abc/sub%20dir/x.json")
    assert parse_directory_source("hf://o/r", SourceSettings()).revision == "main"


def test_s3_prefix_and_its_names() -> None:
    source = parse_directory_source("s3://models/zai-org/GLM-4-9B-0414/",
                                    SourceSettings(s3_endpoint="https://minio:9000"))
    assert isinstance(source, S3Prefix)
    assert source.prefix == "zai-org/GLM-4-9B-0414/" and source.dirname == "GLM-4-9B-0414"
    assert source.object_source("zai-org/GLM-4-9B-0414/a b.json").url == (
        "https://minio:9000/models/zai-org/GLM-4-9B-0414/a%20b.json")
    assert parse_directory_source("s3://models/", SourceSettings()).dirname == "models"


@pytest.mark.parametrize(("uri", "words"), [
    ("hf://zai-org/GLM?revision=main&x=1", "only revision is allowed"),
    ("s3://models/../etc/", "no '..'"),
    ("s3://models/a//", "one '/'"),
    ("https://h/dir/", "only hf://org/repo and s3://bucket/prefix/"),
])
def test_bad_folder_uris_name_the_field(uri: str, words: str) -> None:
    with pytest.raises(InvalidSourceURI, match=r"spec\.source\.uri") as info:
        parse_directory_source(uri, SourceSettings())
    assert words in str(info.value)


def test_plain_http_hub_endpoint_needs_allow_http() -> None:
    with pytest.raises(InvalidSourceURI, match="plain http"):
        parse_directory_source("hf://o/r", SourceSettings(hf_endpoint="http://hub"))


def test_s3_list_query_is_in_sigv4_canonical_order_and_encoding() -> None:
    assert _s3_query("zai-org/GLM 4/", 2, "a/b+c=") == (
        "continuation-token=a%2Fb%2Bc%3D&list-type=2&max-keys=2&prefix=zai-org%2FGLM%204%2F")


def _files(*paths: str) -> list[RemoteFile]:
    return [RemoteFile(p, 1, HttpSource(url=f"https://h/{p}", display=p, filename=p))
            for p in paths]


def test_select_keeps_what_vllm_reads_sorted_by_bytes() -> None:
    kept, skipped = _select("src", _files(
        "model-00002-of-00002.safetensors", "Config.json", "config.json", "README.md",
        "pytorch_model.bin", ".gitattributes", "original/consolidated.00.pth",
        "tokenizer.model", "merges.txt", "modeling_chatglm.py", "chat_template.jinja",
        "model-00001-of-00002.safetensors", ".glm-operator-manifest.json"), DEFAULT_INCLUDE)
    assert [f.path for f in kept] == [
        "Config.json", "chat_template.jinja", "config.json", "merges.txt",
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "modeling_chatglm.py", "tokenizer.model"]
    assert sorted(skipped) == sorted([
        "README.md", "pytorch_model.bin", ".gitattributes", "original/consolidated.00.pth",
        ".glm-operator-manifest.json"])


def test_select_refuses_folders_without_weights_or_with_escaping_names() -> None:
    with pytest.raises(InvalidModelFile, match=r"no \*\.safetensors"):
        _select("src", _files("config.json", "pytorch_model.bin"), DEFAULT_INCLUDE)
    with pytest.raises(SourceNotFound, match="no files matching"):
        _select("src", _files("README.md"), DEFAULT_INCLUDE)
    for bad in ("../x.safetensors", "/abs.safetensors", "a/./b.json", "a\\b.json"):
        with pytest.raises(InvalidModelFile, match="refusing the file name"):
            _select("src", _files(bad, "m.safetensors"), DEFAULT_INCLUDE)


def test_snapshot_digest_is_sha256sum_of_sorted_paths(tmp_path: Path) -> None:
    files = {"b.json": b"{}", "B.json": b"[]", "a/b.safetensors": b"x" * 10,
             "a.b.json": b"1"}
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    entries = [ManifestEntry(n, len(d), hashlib.sha256(d).hexdigest()) for n, d in files.items()]
    text = sha256sums_text(entries).decode()
    assert [line.split("  ")[1] for line in text.splitlines()] == [
        "B.json", "a.b.json", "a/b.safetensors", "b.json"]  # bytes order: '.' < '/' < 'b'
    coreutils = subprocess.run(
        ["bash", "-c", "find . -type f -printf '%P\\n' | LC_ALL=C sort | xargs -d '\\n' "
                       "sha256sum"], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert coreutils.stdout == text
    assert snapshot_digest(entries) == hashlib.sha256(text.encode()).hexdigest()
    assert snapshot_digest(reversed(entries)) == snapshot_digest(entries)


def test_facts_from_a_glm45_config_count_nextn_like_a_gguf() -> None:
    facts = facts_from_config(GLM45_AIR, size_bytes=10, parameter_count=20)
    dumped = facts.model_dump(by_alias=True, exclude_none=True)
    assert dumped == {
        "architecture": "glm4moe", "blockCount": 47, "nextnPredictLayers": 1,
        "embeddingLength": 4096, "headCount": 96, "headCountKv": 8, "keyLength": 128,
        "valueLength": 128, "contextLength": 131072, "expertCount": 128,
        "expertUsedCount": 8, "vocabSize": 151552, "parameterCount": 20, "sizeBytes": 10}


def test_facts_of_other_families() -> None:
    glm4 = facts_from_config({"architectures": ["Glm4ForCausalLM"], "num_hidden_layers": 40,
                              "hidden_size": 4096, "num_attention_heads": 32,
                              "num_key_value_heads": 2, "max_position_embeddings": 32768,
                              "num_nextn_predict_layers": 1})
    assert glm4.architecture == "glm4" and glm4.block_count == 40  # no nextn added: not in GGUF
    chatglm = facts_from_config({"architectures": ["ChatGLMModel"], "model_type": "chatglm",
                                 "num_layers": 40, "hidden_size": 4096,
                                 "num_attention_heads": 32, "multi_query_group_num": 2,
                                 "kv_channels": 128, "seq_length": 131072,
                                 "padded_vocab_size": 151552})
    assert (chatglm.architecture, chatglm.block_count, chatglm.head_count_kv,
            chatglm.key_length, chatglm.context_length, chatglm.vocab_size) == (
        "chatglm", 40, 2, 128, 131072, 151552)
    vision = facts_from_config({"architectures": ["Glm4vMoeForConditionalGeneration"],
                                "model_type": "glm4v_moe",
                                "text_config": {"num_hidden_layers": 46, "hidden_size": 4096,
                                                "num_attention_heads": 96}})
    assert vision.architecture == "glm4v_moe" and vision.block_count == 46
    odd = facts_from_config({"model_type": "x", "num_hidden_layers": 5000, "hidden_size": 8})
    assert odd.block_count is None and odd.embedding_length == 8  # out of range: dropped


def test_architecture_names_and_matching() -> None:
    arch, names = architecture_names(GLM45_AIR)
    assert arch == "glm4moe" and names == ["glm4moe", "Glm4MoeForCausalLM", "glm4_moe"]
    assert architecture_matches("glm4moe", names) and architecture_matches("glm4_moe", names)
    assert not architecture_matches("glm4", names)


def test_safetensors_parameter_count(tmp_path: Path) -> None:
    header = {"__metadata__": {"format": "pt"},
              "a": {"dtype": "BF16", "shape": [3, 4], "data_offsets": [0, 24]},
              "b": {"dtype": "BF16", "shape": [5], "data_offsets": [24, 34]}}
    raw = json.dumps(header).encode()
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 34)
    assert safetensors_parameter_count(path) == 17
    path.write_bytes(struct.pack("<Q", 2**40) + b"{}")
    with pytest.raises(ValueError, match="not plausible"):
        safetensors_parameter_count(path)


def _status_for(facts: dict[str, Any]) -> dict[str, Any]:
    result = SnapshotResult(Path("/cache/GLM-4.5-Air"), 1000, "c" * 64,
                            [ManifestEntry("config.json", 1000, "d" * 64)],
                            facts_from_config(facts, 1000), False, "e" * 40, 0, 1.0)
    obj = {"metadata": {"name": "mv", "generation": 2}, "spec": {"sha256": "c" * 64}}
    return success_status(obj, result, StatusTarget("ns", "mv", "mv-cache"), "GLM-4.5-Air",
                          datetime(2026, 1, 1, tzinfo=UTC))


def test_snapshot_status_feeds_the_planner_trunk_layers() -> None:
    status = _status_for(GLM45_AIR)
    parsed = ModelVersionStatus.model_validate(status)
    assert parsed.sha256 == "c" * 64 and parsed.size_bytes == 1000
    assert status["cache"] == {"path": "GLM-4.5-Air", "claimName": "mv-cache"}
    verified = next(c for c in status["conditions"] if c["type"] == "Verified")
    assert "snapshot digest matches spec.sha256" in verified["message"]
    assert "config.json architecture=glm4moe" in verified["message"]
    mv = ModelVersion.model_validate({
        "metadata": {"name": "mv", "namespace": "ns"},
        "spec": {"source": {"uri": "hf://zai-org/GLM-4.5-Air"}, "format": "safetensors",
                 "quantization": "bf16", "architecture": "glm4moe"},
        "status": status})
    facts = model_facts_for(mv)
    # 46 trunk layers, as config.json's num_hidden_layers says: the nextn layer that
    # blockCount carries (GGUF convention) is subtracted again by the planner.
    assert facts.block_count == 46 and facts.nextn_predict_layers == 1
    assert facts.head_dim_k == 128 and facts.expert_count == 128


EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*/modelversion.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.parent.name)
def test_fetch_writes_where_the_engine_reads(path: Path) -> None:
    """The folder (or file) the fetch Job writes under /cache is the path the engine pod
    gets under /models (render/pod.py model_relative_path), for every example."""
    import yaml
    from glm_operator.fetch.sources import parse_source
    from glm_operator.render.pod import model_relative_path

    mv = ModelVersion.model_validate(yaml.safe_load(path.read_text()))
    uri = mv.spec.source.uri
    if is_directory_uri(uri):
        assert mv.spec.format == "safetensors"
        written = parse_directory_source(uri, SourceSettings()).dirname
    else:
        written = parse_source(uri, SourceSettings()).filename
    assert written == model_relative_path(mv)
