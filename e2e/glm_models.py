"""Tiny random-weight GGUFs of every GLM architecture the pinned llama.cpp tree knows.

    write_glm_model(path, GLM_SPECS["glm-dsa"])

One writer per architecture (chatglm, glm4, glm4moe, glm-dsa, glm5-next), each writing the
keys its `load_arch_hparams` reads and the tensors its `load_arch_tensors` creates in the
llama.cpp tree vendored in the pinned llama-cpp-python sdist (src/models/<arch>.cpp; names
from gguf-py's tensor map). The installed `gguf` package (0.19.0 on PyPI) does not know
`glm5-next`, and none of its arch-specific keys have writer methods, so keys and tensor
names are written as strings; GGUFWriter accepts any.

Every weight is random except the output matrix: all its rows are zero but two, `+u` for the
token "Hello<|user|>" and `-u` for "Bye<|observation|>" (u = ones). Whatever the final hidden
state h is, one of those two tokens has the largest logit (h.u > 0 or < 0), so a greedy
reply is a string of them and every reply contains a GLM stop sequence: served with the
family's stops it ends "Hello" or "Bye" with finish_reason "stop"; without them it runs to
max_tokens with the stop text in it (e2e/test_glm_architectures.py).

The nextn (MTP) layer of glm4moe / glm-dsa / glm5-next is the last block (block_count counts
it, as llama.cpp's converter writes it); the pinned llama-server skips its tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import gguf
import numpy as np

from e2e.models import BOS_ID, EOS_ID, SPECIAL_TOKENS, UNK_ID, _byte_token

Architecture = Literal["chatglm", "glm4", "glm4moe", "glm-dsa", "glm5-next"]
STOP_TOKENS = ("Hello<|user|>", "Bye<|observation|>")
STOP_REPLIES = ("Hello", "Bye")  # what a reply is, cut at its first stop sequence
GLM_VOCAB = (*SPECIAL_TOKENS, *(_byte_token(b) for b in range(256)), *STOP_TOKENS)
GLM_VOCAB_SIZE = len(GLM_VOCAB)
PLUS_ID, MINUS_ID = GLM_VOCAB_SIZE - 2, GLM_VOCAB_SIZE - 1
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|' + message['role'] + '|>\n'"
    " + message['content']}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|assistant|>\n' }}{% endif %}"
)


@dataclass(frozen=True)
class GlmSpec:
    """Shape of one tiny GLM model (llama.cpp's names: n_embd, n_head, ...)."""

    architecture: Architecture
    n_layer: int  # trunk layers
    n_embd: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_rot: int = 32  # GLM-4 rotates half of each head
    n_ff: int = 512
    n_ctx_train: int = 65536
    # MoE (glm4moe, glm-dsa, glm5-next)
    nextn: int = 0
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 128
    n_expert_shared: int = 1
    n_dense_lead: int = 1
    # MLA (glm-dsa, glm5-next): one latent KV head of kv_lora_rank (+ n_rot rotated dims)
    q_lora_rank: int = 128
    kv_lora_rank: int = 128
    qk_nope_head_dim: int = 64
    v_head_dim: int = 64
    # DSA indexer
    indexer_head_count: int = 4
    indexer_key_length: int = 64
    indexer_top_k: int = 64
    indexer_kpool: int = 4  # glm5-next only
    # glm5-next: which trunk layers are KDA (linear attention); the others are MLA + DSA
    kda_layers: tuple[int, ...] = ()
    kda_head_dim: int = 32
    ssm_conv_kernel: int = 4
    seed: int = 0
    name: str = field(default="")

    @property
    def block_count(self) -> int:
        return self.n_layer + self.nextn


GLM_SPECS: dict[str, GlmSpec] = {
    "chatglm": GlmSpec("chatglm", n_layer=6, n_embd=256, n_head=4, n_head_kv=2, head_dim=64,
                       n_ff=768, name="tiny-chatglm"),
    "glm4": GlmSpec("glm4", n_layer=6, n_embd=256, n_head=8, n_head_kv=2, head_dim=32,
                    n_rot=16, n_ff=768, name="tiny-glm4"),
    "glm4moe": GlmSpec("glm4moe", n_layer=5, nextn=1, n_embd=256, n_head=8, n_head_kv=2,
                       head_dim=64, n_ff=512, n_expert=8, n_expert_used=2, n_ff_exp=128,
                       name="tiny-glm4moe"),
    "glm-dsa": GlmSpec("glm-dsa", n_layer=5, nextn=1, n_embd=256, n_head=8, n_head_kv=1,
                       n_rot=32, n_ff=512, n_expert=8, n_expert_used=2, n_ff_exp=128,
                       q_lora_rank=128, kv_lora_rank=128, qk_nope_head_dim=64, v_head_dim=64,
                       name="tiny-glm-dsa"),
    "glm5-next": GlmSpec("glm5-next", n_layer=6, nextn=1, n_embd=256, n_head=8, n_head_kv=1,
                         n_rot=0, n_ff=512, n_expert=8, n_expert_used=2, n_ff_exp=128,
                         q_lora_rank=128, kv_lora_rank=128, qk_nope_head_dim=128,
                         v_head_dim=64, kda_layers=(0, 1, 3, 4), kda_head_dim=32,
                         indexer_top_k=64, indexer_kpool=4, name="tiny-glm5-next"),
}


class _Writer:
    """Tensors by ggml shape (ne: innermost first), random f32 values."""

    def __init__(self, writer: gguf.GGUFWriter, seed: int) -> None:
        self.writer = writer
        self.rng = np.random.default_rng(seed)

    def weight(self, name: str, *ne: int, scale: float = 0.02) -> None:
        values = self.rng.standard_normal(tuple(reversed(ne))) * scale
        self.writer.add_tensor(name, values.astype(np.float32))

    def ones(self, name: str, *ne: int) -> None:
        self.writer.add_tensor(name, np.ones(tuple(reversed(ne)), dtype=np.float32))

    def zeros(self, name: str, *ne: int) -> None:
        self.writer.add_tensor(name, np.zeros(tuple(reversed(ne)), dtype=np.float32))


def _add_vocab(writer: gguf.GGUFWriter) -> None:
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * len(STOP_TOKENS)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(list(GLM_VOCAB))
    writer.add_token_scores([0.0] * GLM_VOCAB_SIZE)
    writer.add_token_types(types)
    writer.add_unk_token_id(UNK_ID)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)


def _output(w: _Writer, n_embd: int) -> None:
    """token_embd, output_norm and the two-row output matrix (see the module docstring)."""
    w.weight("token_embd.weight", n_embd, GLM_VOCAB_SIZE, scale=1.0)
    w.ones("output_norm.weight", n_embd)
    out = np.zeros((GLM_VOCAB_SIZE, n_embd), dtype=np.float32)
    out[PLUS_ID], out[MINUS_ID] = 1.0, -1.0
    w.writer.add_tensor("output.weight", out)


def write_glm_model(path: Path, spec: GlmSpec) -> Path:
    """Write the tiny random-weight GGUF of `spec.architecture`; return `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arch = spec.architecture
    writer = gguf.GGUFWriter(str(path), arch)
    w = _Writer(writer, spec.seed)

    def u32(key: str, value: int) -> None:
        writer.add_uint32(f"{arch}.{key}", value)

    writer.add_name(spec.name or f"tiny-{arch}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(spec.n_ctx_train)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.block_count)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(spec.n_rot)
    writer.add_vocab_size(GLM_VOCAB_SIZE)
    if spec.nextn:
        u32("nextn_predict_layers", spec.nextn)
    _add_vocab(writer)
    _output(w, spec.n_embd)
    {
        "chatglm": _chatglm,
        "glm4": _glm4,
        "glm4moe": _glm4moe,
        "glm-dsa": _glm_dsa,
        "glm5-next": _glm5_next,
    }[arch](w, spec, u32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _gqa_attention(w: _Writer, spec: GlmSpec, i: int) -> None:
    q, kv = spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim
    w.weight(f"blk.{i}.attn_q.weight", spec.n_embd, q)
    w.weight(f"blk.{i}.attn_k.weight", spec.n_embd, kv)
    w.weight(f"blk.{i}.attn_v.weight", spec.n_embd, kv)
    w.zeros(f"blk.{i}.attn_q.bias", q)
    w.zeros(f"blk.{i}.attn_k.bias", kv)
    w.zeros(f"blk.{i}.attn_v.bias", kv)
    w.weight(f"blk.{i}.attn_output.weight", q, spec.n_embd)


def _chatglm(w: _Writer, spec: GlmSpec, u32: object) -> None:
    w.writer.add_head_count_kv(spec.n_head_kv)
    w.writer.add_key_length(spec.head_dim)
    w.writer.add_value_length(spec.head_dim)
    for i in range(spec.n_layer):
        w.ones(f"blk.{i}.attn_norm.weight", spec.n_embd)
        _gqa_attention(w, spec, i)
        w.ones(f"blk.{i}.ffn_norm.weight", spec.n_embd)
        w.weight(f"blk.{i}.ffn_up.weight", spec.n_embd, 2 * spec.n_ff)
        w.weight(f"blk.{i}.ffn_down.weight", spec.n_ff, spec.n_embd)


def _glm4(w: _Writer, spec: GlmSpec, u32: object) -> None:
    w.writer.add_head_count_kv(spec.n_head_kv)
    w.writer.add_key_length(spec.head_dim)
    w.writer.add_value_length(spec.head_dim)
    for i in range(spec.n_layer):
        w.ones(f"blk.{i}.attn_norm.weight", spec.n_embd)
        _gqa_attention(w, spec, i)
        w.ones(f"blk.{i}.post_attention_norm.weight", spec.n_embd)
        w.ones(f"blk.{i}.ffn_norm.weight", spec.n_embd)
        w.weight(f"blk.{i}.ffn_up.weight", spec.n_embd, 2 * spec.n_ff)
        w.weight(f"blk.{i}.ffn_down.weight", spec.n_ff, spec.n_embd)
        w.ones(f"blk.{i}.post_ffw_norm.weight", spec.n_embd)


def _moe_keys(spec: GlmSpec, u32: object) -> None:
    assert callable(u32)
    u32("expert_count", spec.n_expert)
    u32("expert_used_count", spec.n_expert_used)
    u32("expert_feed_forward_length", spec.n_ff_exp)
    u32("expert_shared_count", spec.n_expert_shared)
    u32("leading_dense_block_count", spec.n_dense_lead)


def _ffn(w: _Writer, spec: GlmSpec, i: int) -> None:
    """A dense FFN for the leading layers, else routed experts plus the shared expert."""
    e, ff = spec.n_embd, spec.n_ff_exp
    if i < spec.n_dense_lead:
        w.weight(f"blk.{i}.ffn_gate.weight", e, spec.n_ff)
        w.weight(f"blk.{i}.ffn_up.weight", e, spec.n_ff)
        w.weight(f"blk.{i}.ffn_down.weight", spec.n_ff, e)
        return
    w.weight(f"blk.{i}.ffn_gate_inp.weight", e, spec.n_expert)
    w.zeros(f"blk.{i}.exp_probs_b.bias", spec.n_expert)
    w.weight(f"blk.{i}.ffn_gate_exps.weight", e, ff, spec.n_expert)
    w.weight(f"blk.{i}.ffn_up_exps.weight", e, ff, spec.n_expert)
    w.weight(f"blk.{i}.ffn_down_exps.weight", ff, e, spec.n_expert)
    shared = ff * spec.n_expert_shared
    w.weight(f"blk.{i}.ffn_gate_shexp.weight", e, shared)
    w.weight(f"blk.{i}.ffn_up_shexp.weight", e, shared)
    w.weight(f"blk.{i}.ffn_down_shexp.weight", shared, e)


def _nextn(w: _Writer, spec: GlmSpec, i: int) -> None:
    w.weight(f"blk.{i}.nextn.eh_proj.weight", 2 * spec.n_embd, spec.n_embd)
    w.ones(f"blk.{i}.nextn.enorm.weight", spec.n_embd)
    w.ones(f"blk.{i}.nextn.hnorm.weight", spec.n_embd)
    w.ones(f"blk.{i}.nextn.shared_head_norm.weight", spec.n_embd)


def _glm4moe(w: _Writer, spec: GlmSpec, u32: object) -> None:
    w.writer.add_head_count_kv(spec.n_head_kv)
    w.writer.add_key_length(spec.head_dim)
    w.writer.add_value_length(spec.head_dim)
    _moe_keys(spec, u32)
    for i in range(spec.block_count):
        w.ones(f"blk.{i}.attn_norm.weight", spec.n_embd)
        _gqa_attention(w, spec, i)
        w.ones(f"blk.{i}.attn_q_norm.weight", spec.head_dim)
        w.ones(f"blk.{i}.attn_k_norm.weight", spec.head_dim)
        w.ones(f"blk.{i}.post_attention_norm.weight", spec.n_embd)
        _ffn(w, spec, i)
        if i >= spec.n_layer:
            _nextn(w, spec, i)


def _mla_keys(spec: GlmSpec, u32: object) -> None:
    """DeepSeek-style MLA as the converter writes it: one KV head whose K is the latent
    (kv_lora_rank) plus the rotated dims and whose V is the latent; the per-head sizes an
    MHA view would have go to the *_mla keys."""
    assert callable(u32)
    u32("attention.q_lora_rank", spec.q_lora_rank)
    u32("attention.kv_lora_rank", spec.kv_lora_rank)
    u32("attention.key_length", spec.kv_lora_rank + spec.n_rot)
    u32("attention.value_length", spec.kv_lora_rank)
    u32("attention.key_length_mla", spec.qk_nope_head_dim + spec.n_rot)
    u32("attention.value_length_mla", spec.v_head_dim)
    u32("attention.indexer.head_count", spec.indexer_head_count)
    u32("attention.indexer.key_length", spec.indexer_key_length)
    u32("attention.indexer.top_k", spec.indexer_top_k)


def _mla_attention(w: _Writer, spec: GlmSpec, i: int) -> None:
    e, h = spec.n_embd, spec.n_head
    k_mla = spec.qk_nope_head_dim + spec.n_rot
    w.ones(f"blk.{i}.attn_q_a_norm.weight", spec.q_lora_rank)
    w.ones(f"blk.{i}.attn_kv_a_norm.weight", spec.kv_lora_rank)
    w.weight(f"blk.{i}.attn_q_a.weight", e, spec.q_lora_rank)
    w.weight(f"blk.{i}.attn_q_b.weight", spec.q_lora_rank, h * k_mla)
    w.weight(f"blk.{i}.attn_kv_a_mqa.weight", e, spec.kv_lora_rank + spec.n_rot)
    w.weight(f"blk.{i}.attn_k_b.weight", spec.qk_nope_head_dim, spec.kv_lora_rank, h)
    w.weight(f"blk.{i}.attn_v_b.weight", spec.kv_lora_rank, spec.v_head_dim, h)
    w.weight(f"blk.{i}.attn_output.weight", h * spec.v_head_dim, e)


def _indexer(w: _Writer, spec: GlmSpec, i: int) -> None:
    d, heads = spec.indexer_key_length, spec.indexer_head_count
    w.ones(f"blk.{i}.indexer.k_norm.weight", d)
    w.zeros(f"blk.{i}.indexer.k_norm.bias", d)
    w.weight(f"blk.{i}.indexer.proj.weight", spec.n_embd, heads)
    w.weight(f"blk.{i}.indexer.attn_k.weight", spec.n_embd, d)
    w.weight(f"blk.{i}.indexer.attn_q_b.weight", spec.q_lora_rank, heads * d)


def _glm_dsa(w: _Writer, spec: GlmSpec, u32: object) -> None:
    w.writer.add_head_count_kv(1)
    _moe_keys(spec, u32)
    _mla_keys(spec, u32)
    for i in range(spec.block_count):
        w.ones(f"blk.{i}.attn_norm.weight", spec.n_embd)
        _mla_attention(w, spec, i)
        _indexer(w, spec, i)
        w.ones(f"blk.{i}.ffn_norm.weight", spec.n_embd)
        _ffn(w, spec, i)
        if i >= spec.n_layer:
            _nextn(w, spec, i)


HC_MULT = 4  # the pinned tree supports mHC with 4 residual streams only


def _glm5_next(w: _Writer, spec: GlmSpec, u32: object) -> None:
    assert callable(u32)
    # Per layer: 0 KV heads marks a KDA (recurrent) layer, 1 an MLA layer with a KV cache.
    head_count_kv = [0 if i in spec.kda_layers else 1 for i in range(spec.block_count)]
    w.writer.add_array(f"{spec.architecture}.attention.head_count_kv", head_count_kv)
    _moe_keys(spec, u32)
    _mla_keys(spec, u32)
    # nope-only MLA: the cached K is the latent alone
    u32("attention.key_length", spec.kv_lora_rank)
    u32("attention.key_length_mla", spec.qk_nope_head_dim)
    u32("attention.indexer.kpool", spec.indexer_kpool)
    u32("ssm.conv_kernel", spec.ssm_conv_kernel)
    u32("kda.head_dim", spec.kda_head_dim)
    u32("hyper_connection.count", HC_MULT)
    u32("hyper_connection.sinkhorn_iterations", 3)
    w.writer.add_float32(f"{spec.architecture}.hyper_connection.epsilon", 1e-6)
    e, h = spec.n_embd, spec.n_head
    mix = (2 + HC_MULT) * HC_MULT
    d_inner = spec.kda_head_dim * h
    for i in range(spec.block_count):
        w.ones(f"blk.{i}.attn_norm.weight", e)
        w.ones(f"blk.{i}.ffn_norm.weight", e)
        if i < spec.n_layer:
            for part in ("attn", "ffn"):
                w.weight(f"blk.{i}.hc_{part}_fn.weight", HC_MULT * e, mix)
                w.zeros(f"blk.{i}.hc_{part}_base.weight", mix)
                w.ones(f"blk.{i}.hc_{part}_scale.weight", 3)
        if i in spec.kda_layers:
            for qkv in "qkv":
                w.weight(f"blk.{i}.ssm_conv1d_{qkv}.weight", spec.ssm_conv_kernel, 1, d_inner,
                         scale=0.5)
                w.weight(f"blk.{i}.attn_{qkv}.weight", e, d_inner)
            w.weight(f"blk.{i}.ssm_f_a.weight", e, spec.kda_head_dim)
            w.weight(f"blk.{i}.ssm_f_b.weight", spec.kda_head_dim, d_inner)
            w.weight(f"blk.{i}.ssm_beta.weight", e, h)
            w.writer.add_tensor(f"blk.{i}.ssm_a", -np.ones(h, dtype=np.float32))
            w.zeros(f"blk.{i}.ssm_dt.bias", d_inner)
            w.weight(f"blk.{i}.ssm_g_a.weight", e, spec.kda_head_dim)
            w.weight(f"blk.{i}.ssm_g_b.weight", spec.kda_head_dim, d_inner)
            w.ones(f"blk.{i}.ssm_norm.weight", spec.kda_head_dim)
            w.weight(f"blk.{i}.attn_output.weight", d_inner, e)
        else:
            _mla_attention(w, spec, i)
            _indexer(w, spec, i)
            w.weight(f"blk.{i}.indexer_compressor_gate.weight", e, spec.indexer_key_length)
            w.weight(f"blk.{i}.indexer_compressor_ape.weight", spec.indexer_key_length,
                     spec.indexer_kpool)
        _ffn(w, spec, i)
        if i >= spec.n_layer:
            _nextn(w, spec, i)
