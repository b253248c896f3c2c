"""GGUF files for the fetcher's tests, written with the `gguf` package's GGUFWriter."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np

MakeGGUF = Callable[..., Path]


def write_gguf(path: Path, arch: str, keys: dict[str, Any] | None = None,
               tensors: int = 2, vocab: int = 300) -> Path:
    """A small GGUF: `keys` under the arch prefix (uint32), a string vocabulary, a few tensors."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"test-{arch}")
    for key, value in (keys or {}).items():
        full = f"{arch}.{key}"
        if isinstance(value, list):
            writer.add_array(full, value)
        else:
            writer.add_uint32(full, value)
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_K_M))
    writer.add_tokenizer_model("gpt2")
    # A vocabulary array of strings and a float array: the parser must skip both correctly.
    writer.add_token_list([f"tok{i}" for i in range(vocab)])
    writer.add_token_scores([float(i) for i in range(vocab)])
    writer.add_float32("general.some_float", 0.5)
    writer.add_bool("general.some_bool", True)
    for index in range(tensors):
        writer.add_tensor(f"blk.{index}.weight", np.full((4, 8), index, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


GLM4_KEYS = {"block_count": 40, "context_length": 131072, "embedding_length": 4096,
             "attention.head_count": 32, "attention.head_count_kv": 2,
             "attention.key_length": 128, "attention.value_length": 128,
             "feed_forward_length": 13696}
GLM4MOE_KEYS = {**GLM4_KEYS, "block_count": 47, "nextn_predict_layers": 1, "expert_count": 128,
                "expert_used_count": 8, "feed_forward_length": 10944,
                "expert_feed_forward_length": 1408}
LLAMA_KEYS = {"block_count": 2, "context_length": 4096, "embedding_length": 64,
              "attention.head_count": 4, "attention.head_count_kv": 2}
