"""Shared pieces of the fetcher e2e tests: a GGUF to serve and the real CLI as a subprocess."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent


def write_served_gguf(path: Path, arch: str = "glm4", payload_mib: int = 3) -> Path:
    """A GGUF with a real GLM-style header and `payload_mib` MiB of tensor data to download."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"served-{arch}")
    writer.add_block_count(40)
    writer.add_context_length(131072)
    writer.add_embedding_length(4096)
    writer.add_head_count(32)
    writer.add_head_count_kv(2)
    writer.add_key_length(128)
    writer.add_value_length(128)
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_K_M))
    rng = np.random.default_rng(7)
    floats = payload_mib * 1024 * 1024 // 4
    writer.add_tensor("token_embd.weight", rng.standard_normal((floats // 1024, 1024),
                                                               dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class FetchRun:
    code: int
    log: str


def run_fetch(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> FetchRun:
    """`glm-operator fetch ARGS` in a fresh process, as the Job runs it."""
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith(("AWS_", "HF_", "GLM_FETCH_"))}
    environment.update(env or {})
    result = subprocess.run(
        [sys.executable, "-m", "glm_operator.cli", "fetch", "--progress-interval", "0.2",
         "--retry-delay", "0.05", *args],
        capture_output=True, text=True, env=environment, timeout=timeout, cwd=REPO_ROOT,
    )
    return FetchRun(result.returncode, result.stdout + result.stderr)


def write_safetensors(path: Path, tensors: dict[str, tuple[int, ...]], seed: int = 0) -> int:
    """A real .safetensors file (8-byte header length, JSON header, F32 data); returns the
    number of parameters it holds."""
    rng = np.random.default_rng(seed)
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, shape in tensors.items():
        data = rng.standard_normal(shape, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(raw)) + raw)
        for blob in blobs:
            out.write(blob)
    return sum(int(np.prod(shape)) for shape in tensors.values())


# A GLM-4.5-Air-shaped config.json (the numbers of zai-org/GLM-4.5-Air), tiny weights.
GLM4MOE_CONFIG: dict[str, object] = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
    "num_hidden_layers": 46, "num_nextn_predict_layers": 1, "hidden_size": 4096,
    "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 131072, "n_routed_experts": 128, "num_experts_per_tok": 8,
    "vocab_size": 151552, "torch_dtype": "bfloat16",
}


@dataclass
class SafetensorsModel:
    folder: Path
    parameters: int
    included: list[str]  # the files a default fetch keeps, sorted by path bytes
    excluded: list[str]  # the files the default include patterns leave out


def write_safetensors_model(folder: Path, shards: int = 2, rows: int = 256) -> SafetensorsModel:
    """A Hugging Face style model folder: config, tokenizer, sharded safetensors with their
    index, plus files a vLLM fetch leaves out (pickled weights, README, .gitattributes)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(GLM4MOE_CONFIG, indent=2))
    (folder / "generation_config.json").write_text('{"eos_token_id": [151329, 151336]}')
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0, "b": 1}}}))
    (folder / "tokenizer_config.json").write_text('{"model_max_length": 131072}')
    (folder / "chat_template.jinja").write_text("[gMASK]<sop>{% for m in messages %}{% endfor %}")
    (folder / "original").mkdir(exist_ok=True)
    (folder / "original" / "tokenizer.model").write_bytes(b"\x0a\x05hello" * 100)
    parameters, weight_map = 0, {}
    for shard in range(1, shards + 1):
        name = f"model-{shard:05d}-of-{shards:05d}.safetensors"
        tensors = {f"model.layers.{shard}.mlp.weight": (rows, 1024),
                   f"model.layers.{shard}.attn.weight": (rows // 2, 1024)}
        parameters += write_safetensors(folder / name, tensors, seed=shard)
        weight_map.update({t: name for t in tensors})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": parameters * 4}, "weight_map": weight_map}))
    excluded = ["pytorch_model.bin", "README.md", ".gitattributes"]
    (folder / "pytorch_model.bin").write_bytes(b"pickle" * 1000)
    (folder / "README.md").write_text("# tiny\n")
    (folder / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    included = sorted((p.relative_to(folder).as_posix() for p in folder.rglob("*")
                       if p.is_file() and p.relative_to(folder).as_posix() not in excluded),
                      key=str.encode)
    return SafetensorsModel(folder, parameters, included, excluded)


# docs/fetch.md: the snapshot digest of a local folder, with coreutils.
DIGEST_COMMAND = ("find . -type f ! -name '.glm-operator*' -printf '%P\\n' | LC_ALL=C sort "
                  "| xargs -d '\\n' sha256sum | sha256sum")


def folder_digest(folder: Path, files: list[str] | None = None) -> str:
    """The snapshot digest of `folder` (of `files` in it, else of every file) by coreutils."""
    if files is None:
        result = subprocess.run(["bash", "-c", DIGEST_COMMAND], capture_output=True, text=True,
                                check=True, cwd=folder)
        return result.stdout.split()[0]
    listing = "".join(f"{f}\n" for f in sorted(files, key=str.encode))
    sums = subprocess.run(["xargs", "-d", "\n", "sha256sum", "--"], input=listing,
                          capture_output=True, text=True, check=True, cwd=folder,
                          env={"LC_ALL": "C", "PATH": os.environ["PATH"]}).stdout
    return hashlib.sha256(sums.encode()).hexdigest()
