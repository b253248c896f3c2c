"""`glm-operator plan`: print the capacity plan as a readable table, offline."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from glm_operator.planning.accelerators import PROFILES
from glm_operator.planning.facts import ArchitectureFacts
from glm_operator.planning.planner import (
    LAYOUTS,
    Plan,
    PlanRequest,
    gib,
    layout_label,
    plan,
)
from glm_operator.planning.profile_config import load_profiles


def add_arguments(parser: argparse.ArgumentParser) -> None:
    facts = parser.add_argument_group("model facts")
    facts.add_argument("--gguf-facts", type=Path, metavar="FILE",
                       help="JSON file of model facts (ArchitectureFacts fields, snake_case)")
    facts.add_argument("--arch", help="architecture (glm4, glm4moe, llama, ...)")
    facts.add_argument("--layers", type=int, help="trunk decoder layers (block_count)")
    facts.add_argument("--nextn", type=int, default=0, help="nextn (MTP) layers")
    facts.add_argument("--embd", type=int, help="embedding_length")
    facts.add_argument("--heads", type=int, help="attention head_count")
    facts.add_argument("--kv-heads", type=int, help="attention head_count_kv")
    facts.add_argument("--head-dim", type=int, help="key/value length per head")
    facts.add_argument("--trained-context", type=int, help="trained context_length")
    facts.add_argument("--vocab", type=int, help="vocabulary size")
    facts.add_argument("--ffn", type=int,
                       help="feed_forward_length (FFN width; 4 x --embd when not given)")
    facts.add_argument("--params", type=float, help="parameters, in billions (e.g. 9.4)")
    facts.add_argument("--weights-bytes", type=int, help="measured size of the artifact")
    req = parser.add_argument_group("request")
    req.add_argument("--quantization", required=True)
    req.add_argument("--engine", choices=("llamacpp", "vllm"), required=True)
    req.add_argument("--accelerator", required=True, help=f"profile: {', '.join(sorted(PROFILES))}")
    req.add_argument("--count", type=int, default=1, help="devices per node (per pod)")
    req.add_argument("--nodes", type=int, default=1, help="nodes per replica")
    req.add_argument("--context", type=int, default=8192, help="tokens per request")
    req.add_argument("--concurrency", type=int, default=1, help="requests at once")
    req.add_argument("--kv-cache-type", help="f16, q8_0, q4_0 (llama.cpp); auto, fp8, fp8_e4m3 "
                     "(vLLM; default auto, fp8 for the GLM-5 family on fp8 devices)")
    req.add_argument("--layout", choices=LAYOUTS,
                     help="vLLM: force a layout (tp; dcp: TP with decode context parallelism; "
                          "dep: data-parallel attention + expert parallelism); default: the "
                          "planner chooses")
    req.add_argument("--rank-tp", type=int, default=1, metavar="N",
                     help="vLLM DEP: tensor parallel size inside each data-parallel rank "
                          "(count / N ranks; default 1)")
    req.add_argument("--kv-unified", action="store_true")
    req.add_argument("--no-mmap", action="store_true")
    req.add_argument("--allow-partial-offload", action="store_true")
    req.add_argument("--node-memory-gib", type=float, help="CPU profile: node RAM per replica")
    req.add_argument("--cpu-cores", type=int, help="cores per replica")
    parser.add_argument("--profiles", type=Path, metavar="FILE",
                        help="JSON/YAML file of extra accelerator profiles (operator config)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def _facts(args: argparse.Namespace) -> ArchitectureFacts:
    data: dict[str, Any] = {}
    if args.gguf_facts:
        data.update(json.loads(args.gguf_facts.read_text()))
    flags = {
        "architecture": args.arch,
        "block_count": args.layers,
        "embedding_length": args.embd,
        "head_count": args.heads,
        "head_count_kv": args.kv_heads,
        "key_length": args.head_dim,
        "value_length": args.head_dim,
        "context_length": args.trained_context,
        "vocab_size": args.vocab,
        "feed_forward_length": args.ffn,
        "parameter_count": int(args.params * 1e9) if args.params else None,
        "weights_bytes": args.weights_bytes,
    }
    if args.nextn:
        flags["nextn_predict_layers"] = args.nextn
    data.update({k: v for k, v in flags.items() if v is not None})
    if args.weights_bytes and "quantization" not in data:
        data["quantization"] = args.quantization
    missing = [k for k in ("architecture", "block_count", "embedding_length", "head_count",
                           "head_count_kv", "context_length") if k not in data]
    if missing:
        raise ValueError(f"model facts missing: {', '.join(missing)} (flags or --gguf-facts)")
    return ArchitectureFacts.from_mapping(data)


def _rows(p: Plan) -> list[tuple[str, str]]:
    m = p.memory
    unit = "node RAM" if p.profile.is_cpu else "per device"
    rows = [
        ("model", f"{p.request.facts.architecture}, {p.request.quantization}"
                  f" ({p.weights_basis})"),
        ("placement", (f"{p.request.nodes} nodes x " if p.request.nodes > 1 else "")
                      + f"{p.request.count} x {p.profile.name} ({p.request.engine})"),
        # the profile's nodes; the pods' pin also narrows by the images' builds
        ("node architectures", ", ".join(p.profile.architectures)),
        (f"weights ({unit})", f"{gib(m.weights)} GiB"),
        ("KV cache", f"{gib(m.kv)} GiB ({p.kv_bytes_per_token} bytes/token)"),
        ("compute buffers", f"{gib(m.compute)} GiB"),
        ("runtime overhead", f"{gib(m.overhead)} GiB"),
        ("total", f"{gib(m.total)} GiB"),
        ("reserve", f"{gib(m.reserved)} GiB"),
        ("available", f"{gib(m.available)} GiB"),
        ("headroom", f"{gib(m.headroom)} GiB"),
    ]
    if p.llamacpp:
        s = p.llamacpp
        rows += [
            ("--n-gpu-layers", str(s.n_gpu_layers)),
            ("--parallel", str(s.parallel)),
            ("--ctx-size", f"{s.ctx_size} ({s.ctx_per_slot} per slot)"),
            ("--kv-unified", "on" if s.kv_unified else "off"),
            ("--cache-type-k/v", f"{s.cache_type_k}/{s.cache_type_v}"),
            ("--flash-attn", "on" if s.flash_attn else "off"),
            ("--threads", str(s.threads)),
            ("--batch/ubatch", f"{s.batch_size}/{s.ubatch_size}"),
            ("--load-mode", "mmap" if s.mmap else "none"),
            ("--cache-ram", f"{s.cache_ram_mib} MiB"),
        ]
        if s.rpc_workers:
            rows.append(("--rpc", f"{s.rpc_workers} ggml-rpc-server workers; --tensor-split "
                                  + ",".join(str(n) for n in s.tensor_split)))
        elif s.tensor_split:  # several devices of one node: whole layers each, no NVLink needed
            rows.append(("--split-mode", "layer; --tensor-split "
                         + ",".join(str(n) for n in s.tensor_split)))
    if p.vllm:
        v = p.vllm
        rows += [
            ("--max-model-len", str(v.max_model_len)),
            ("--max-num-seqs", str(v.max_num_seqs)),
            ("--gpu-memory-utilization", f"{v.gpu_memory_utilization:.2f}"),
            ("layout", layout_label(v)),
            ("--tensor-parallel-size", str(v.tensor_parallel_size)),
            ("--pipeline-parallel-size", str(v.pipeline_parallel_size)),
            ("--kv-cache-dtype", v.kv_cache_dtype),
            ("--dtype", v.dtype),
            ("KV capacity", f"{v.kv_cache_tokens} tokens"),
        ]
        if v.data_parallel_size > 1:
            rows.append(("--data-parallel-size", f"{v.data_parallel_size} "
                         "(--max-num-seqs is per rank)"))
        if v.enable_expert_parallel:
            rows.append(("--enable-expert-parallel", "on"))
        if v.decode_context_parallel_size > 1:
            rows.append(("--decode-context-parallel-size", str(v.decode_context_parallel_size)))
        if v.speculative_tokens:
            rows.append(("MTP draft tokens", str(v.speculative_tokens)))
        if v.kv_offloading_size:
            rows.append(("--kv-offloading-size", f"{v.kv_offloading_size} GiB per engine core "
                         f"(host KV tier: {v.kv_offload_tokens} tokens, not decoding room)"))
    for i, n in enumerate(p.per_node):
        rows.append((f"node {i} ({n.role})",
                     f"{n.devices} devices, {n.layers} layers, weights {gib(n.weights_bytes)} "
                     f"GiB, KV {gib(n.kv_bytes)} GiB"))
    r = p.resources
    rows += [
        ("cpu request", f"{r.cpu_request:g}"),
        ("memory request/limit",
         f"{gib(r.memory_request_bytes)} / {gib(r.memory_limit_bytes)} GiB"),
        ("memory note", r.memory_note),
    ]
    return rows


def _layout_table(p: Plan) -> list[str]:
    """The layouts the planner weighed on these devices, side by side."""
    if not p.layouts:
        return []
    context = p.request.context_length
    header = ("layout", "fits", "KV tokens", f"requests x {context}", "headroom GiB", "")
    rows = [header] + [
        (lc.label, "yes" if lc.feasible else "no", f"{lc.kv_cache_tokens:,}",
         str(lc.requests_at_context), gib(lc.headroom_bytes), "<- chosen" if lc.chosen else "")
        for lc in p.layouts]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["", f"layouts on {p.request.count} x {p.profile.name} (asked: "
             f"{p.request.concurrency} x {context} tokens; the first that fits in TP, DCP, "
             "DEP order is chosen):"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
              for r in rows]
    return lines


def format_plan(p: Plan) -> str:
    rows = _rows(p)
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    lines += _layout_table(p)
    lines += ["", f"verdict: {'FEASIBLE' if p.feasible else 'DOES NOT FIT'}: {p.reason}"]
    lines += [f"warning: {w}" for w in p.warnings]
    if p.alternatives:
        lines.append("alternatives that fit:")
        lines += [f"  - {a.describe()}" for a in p.alternatives]
    elif not p.feasible:
        lines.append("no single change fits")
    return "\n".join(lines)


def _load_extra_profiles(path: Path | None) -> Mapping[str, Any] | None:
    if path is None:
        return None
    import yaml

    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of profile name -> fields")
    return data


def run(args: argparse.Namespace) -> int:
    try:
        profiles = load_profiles(_load_extra_profiles(args.profiles))
        request = PlanRequest(
            facts=_facts(args),
            quantization=args.quantization,
            engine=args.engine,
            accelerator=args.accelerator,
            count=args.count,
            nodes=args.nodes,
            context_length=args.context,
            concurrency=args.concurrency,
            kv_cache_type=args.kv_cache_type,
            kv_unified=args.kv_unified,
            mmap=not args.no_mmap,
            allow_partial_offload=args.allow_partial_offload,
            node_memory_bytes=int(args.node_memory_gib * 1024**3) if args.node_memory_gib else None,
            cpu_cores=args.cpu_cores,
            layout=args.layout,
            rank_tensor_parallel=args.rank_tp,
        )
        result = plan(request, profiles)
    except (ValueError, OSError) as exc:
        print(f"glm-operator plan: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.summary(), indent=2))
    else:
        print(format_plan(result))
    return 0 if result.feasible else 1
