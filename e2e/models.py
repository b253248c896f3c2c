"""Tiny GGUF models for the tests, written locally with the `gguf` package (nothing downloaded).

- `write_tiny_llama`: a random-weight llama-architecture model that llama-server loads and
  serves. Its vocabulary is the 256 bytes plus <unk>/<s>/</s>, so every byte of a prompt is one
  token: a test can make a prompt of a known token length (see `prompt_of_tokens`).
- `write_glm_header`: a file whose header says `glm4` / `glm4moe` (with the keys the header
  parser reads) and one small tensor; llama-server is not meant to load it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import gguf
import numpy as np

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
BYTE_TOKEN_OFFSET = len(SPECIAL_TOKENS)
VOCAB_SIZE = BYTE_TOKEN_OFFSET + 256
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyLlamaSpec:
    """Shape of a tiny llama model. head_dim = n_embd / n_head."""

    n_ctx_train: int = 4096
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    dtype: Literal["f32", "f16", "q8_0"] = "f32"  # q8_0: the 2-D weights quantized
    seed: int = 0
    name: str = "tiny-llama"

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def validate(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head {self.n_head} is not a multiple of {self.n_head_kv=}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for RoPE")
        if self.dtype == "q8_0" and (self.n_embd % 32 or self.n_ff % 32):
            raise ValueError("q8_0 rows are blocks of 32: n_embd and n_ff must be multiples of 32")


def _byte_token(value: int) -> str:
    return f"<0x{value:02X}>"


def _add_byte_vocab(writer: gguf.GGUFWriter) -> None:
    tokens = [*SPECIAL_TOKENS, *(_byte_token(b) for b in range(256))]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types(types)
    writer.add_unk_token_id(UNK_ID)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_add_bos_token(True)
    writer.add_chat_template(CHATML_TEMPLATE)


def write_tiny_llama(path: Path, spec: TinyLlamaSpec | None = None) -> Path:
    """Write a random-weight llama GGUF that llama-server loads; return `path`."""
    spec = spec or TinyLlamaSpec()
    spec.validate()
    rng = np.random.default_rng(spec.seed)
    dtype = np.float16 if spec.dtype == "f16" else np.float32

    def add_weight(name: str, rows: int, cols: int) -> None:
        # numpy shape is ggml's ne reversed: (rows=out features, cols=in features)
        values = rng.standard_normal((rows, cols)) * 0.02
        if spec.dtype == "q8_0":
            q8_0 = gguf.GGMLQuantizationType.Q8_0
            blocks = gguf.quants.quantize(values.astype(np.float32), q8_0)
            writer.add_tensor(name, blocks, raw_dtype=q8_0)
        else:
            writer.add_tensor(name, values.astype(dtype))

    def norm() -> np.ndarray:
        return np.ones(spec.n_embd, dtype=np.float32)  # llama.cpp wants norms in f32

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(spec.name)
    writer.add_context_length(spec.n_ctx_train)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_rope_dimension_count(spec.head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB_SIZE)
    writer.add_file_type({
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }[spec.dtype])
    _add_byte_vocab(writer)

    q_dim = spec.n_head * spec.head_dim
    kv_dim = spec.n_head_kv * spec.head_dim
    add_weight("token_embd.weight", VOCAB_SIZE, spec.n_embd)
    writer.add_tensor("output_norm.weight", norm())
    add_weight("output.weight", VOCAB_SIZE, spec.n_embd)
    for layer in range(spec.n_layer):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", norm())
        add_weight(f"{prefix}.attn_q.weight", q_dim, spec.n_embd)
        add_weight(f"{prefix}.attn_k.weight", kv_dim, spec.n_embd)
        add_weight(f"{prefix}.attn_v.weight", kv_dim, spec.n_embd)
        add_weight(f"{prefix}.attn_output.weight", spec.n_embd, q_dim)
        writer.add_tensor(f"{prefix}.ffn_norm.weight", norm())
        add_weight(f"{prefix}.ffn_gate.weight", spec.n_ff, spec.n_embd)
        add_weight(f"{prefix}.ffn_up.weight", spec.n_ff, spec.n_embd)
        add_weight(f"{prefix}.ffn_down.weight", spec.n_embd, spec.n_ff)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@dataclass(frozen=True)
class GlmHeaderSpec:
    """What a GLM GGUF header states. glm4moe adds nextn_predict_layers to block_count."""

    architecture: Literal["glm4", "glm4moe"] = "glm4"
    block_count: int = 40
    context_length: int = 131072
    embedding_length: int = 4096
    head_count: int = 32
    head_count_kv: int = 2
    key_length: int = 128
    value_length: int = 128
    nextn_predict_layers: int = 1
    expert_count: int = 128
    expert_used_count: int = 8
    file_type: int = int(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    name: str = "GLM header fixture"


def write_glm_header(path: Path, spec: GlmHeaderSpec | None = None) -> Path:
    """Write a GGUF whose header describes a GLM model (for header and architecture checks)."""
    spec = spec or GlmHeaderSpec()
    arch = spec.architecture
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(spec.name)
    writer.add_block_count(spec.block_count)
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.embedding_length)
    writer.add_head_count(spec.head_count)
    writer.add_head_count_kv(spec.head_count_kv)
    writer.add_key_length(spec.key_length)
    writer.add_value_length(spec.value_length)
    writer.add_file_type(spec.file_type)
    if arch == "glm4moe":
        writer.add_uint32(f"{arch}.nextn_predict_layers", spec.nextn_predict_layers)
        writer.add_expert_count(spec.expert_count)
        writer.add_expert_used_count(spec.expert_used_count)
    writer.add_tokenizer_model("gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def prompt_of_tokens(n_tokens: int) -> str:
    """A prompt text that tokenizes to about `n_tokens` tokens with the byte vocabulary.

    Each ASCII byte is one token; the chat template and BOS add a few more.
    """
    return ("abcdefghij" * (n_tokens // 10 + 1))[:n_tokens]
