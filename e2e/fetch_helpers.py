"""Shared pieces of the fetcher e2e tests: a GGUF to serve and the real CLI as a subprocess."""

from __future__ import annotations

import hashlib
import os
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
