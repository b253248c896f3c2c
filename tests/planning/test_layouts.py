"""vLLM layouts (issue 38): TP, TP with decode context parallelism (DCP) and data-parallel
attention with expert parallelism (DEP); the planner weighs each, shows them side by side and
chooses (docs/planning.md, "Layouts")."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from glm5_facts import GLM5, GLM46
from glm_operator.planning import memory as mem
from glm_operator.planning.cli import format_plan
from glm_operator.planning.planner import LAYOUTS, PlanRequest, plan
from glm_operator.render.engine_args import vllm_argv
from test_planning_cases import GLM4_9B


def _glm5(**changes: object) -> PlanRequest:
    base = {"facts": GLM5, "quantization": "fp8", "engine": "vllm",
            "accelerator": "nvidia-h200", "count": 8, "context_length": 131072,
            "concurrency": 16}
    return PlanRequest(**{**base, **changes})  # type: ignore[arg-type]


def test_the_issues_first_example_plans_one_node() -> None:
    """`glm-operator plan ... --accelerator nvidia-h200 --count 8 --context 131072
    --concurrency 16` on GLM-5 FP8: one node, not three (the fp8 KV cache of the family's
    recipes by default, and a layout whose cache is not copied onto every rank)."""
    p = plan(_glm5())
    assert p.feasible, p.reason
    assert p.vllm is not None and p.vllm.kv_cache_dtype == "fp8"
    assert p.vllm.layout in ("dcp", "dep") and p.resources.devices == 8
    assert p.request.nodes == 1 and not p.alternatives
    by_layout = {lc.layout: lc for lc in p.layouts}
    assert set(by_layout) == {"tp", "dcp", "dep"}
    assert not by_layout["tp"].feasible  # the latent copied on 8 ranks: 5 requests of 128K
    assert by_layout["tp"].requests_at_context < 16 <= by_layout["dep"].requests_at_context
    assert [lc.layout for lc in p.layouts if lc.chosen] == [p.vllm.layout]


def test_the_tie_rule_takes_the_lowest_latency_layout_that_fits() -> None:
    """TP first, then DCP, then DEP (LAYOUTS): at 4 requests TP8 fits and is chosen."""
    assert LAYOUTS == ("tp", "dcp", "dep")
    p = plan(_glm5(concurrency=4))
    assert p.feasible and p.vllm is not None and p.vllm.layout == "tp"
    assert all(lc.feasible for lc in p.layouts)
    p = plan(_glm5())
    assert p.vllm is not None and p.vllm.layout == "dcp"  # TP8 does not fit 16 x 128K


def test_dep_holds_attention_per_rank_and_splits_the_experts() -> None:
    p = plan(_glm5(layout="dep"))
    assert p.feasible and p.vllm is not None
    v = p.vllm
    assert (v.tensor_parallel_size, v.data_parallel_size, v.enable_expert_parallel) == (1, 8, True)
    assert v.max_num_seqs == 2  # 16 requests over 8 ranks: --max-num-seqs is per rank
    weights = mem.weights_bytes(GLM5, "fp8").bytes
    split = mem.moe_weights(GLM5, weights)
    # 754B: 76 MoE layers (75 trunk + nextn) x 256 x 3 x 6144 x 2048 = 734.3B routed
    assert split.experts == pytest.approx(734.3e9, rel=1e-3)
    assert p.memory.weights == split.replicated + split.experts // 8
    # each rank caches its own 2 sequences of 128K: the latent in fp8 and the indexer keys
    assert p.memory.kv == 79 * (576 + 132) * 131072 * 2
    assert v.kv_cache_tokens % 8 == 0  # eight ranks of the same capacity


def test_dcp_shards_the_latent_cache_over_the_tp_ranks() -> None:
    tp, dcp = plan(_glm5(layout="tp", concurrency=4)), plan(_glm5(layout="dcp", concurrency=4))
    assert tp.vllm is not None and dcp.vllm is not None
    assert dcp.vllm.decode_context_parallel_size == 8 == dcp.vllm.tensor_parallel_size
    assert dcp.memory.kv * 8 == pytest.approx(tp.memory.kv, rel=1e-3)  # per-token ceil
    assert dcp.memory.weights == tp.memory.weights


def test_a_dense_model_gets_no_dep_and_says_why() -> None:
    """For a dense model data parallelism is replicas."""
    request = PlanRequest(facts=GLM4_9B, quantization="bf16", engine="vllm",
                          accelerator="nvidia-a100-80gb", count=2, context_length=8192)
    assert all(lc.layout != "dep" for lc in plan(request).layouts)
    forced = plan(replace(request, layout="dep"))
    assert not forced.feasible and "dense model" in forced.reason
    assert "replicas" in forced.reason


def test_gqa_models_get_no_dcp() -> None:
    p = plan(PlanRequest(facts=GLM46, quantization="fp8", engine="vllm",
                         accelerator="nvidia-h100-80gb", count=8, context_length=32768))
    assert [lc.layout for lc in p.layouts] == ["tp", "dep"]
    forced = plan(replace(p.request, layout="dcp"))
    assert not forced.feasible and "MLA" in forced.reason


def test_one_device_and_ascend_plan_tp_only() -> None:
    assert plan(_glm5(count=1, concurrency=1, context_length=8192)).layouts == ()
    a3 = plan(_glm5(quantization="w8a8", accelerator="ascend-910c", count=16, concurrency=1))
    assert a3.layouts == () and a3.vllm is not None and a3.vllm.layout == "tp"


def test_a_forced_layout_that_does_not_fit_is_offered_the_others() -> None:
    p = plan(_glm5(layout="tp"))
    assert not p.feasible
    changes = [a.change for a in p.alternatives]
    assert "layout dcp" in changes and "layout dep" in changes
    assert {"layout": "dep"} in [dict(a.settings) for a in p.alternatives]


def test_fp8_kv_is_offered_first_where_it_makes_the_plan_fit() -> None:
    p = plan(_glm5(kv_cache_type="auto", concurrency=30))
    assert not p.feasible
    first = p.alternatives[0]
    assert first.settings == {"kv_cache_type": "fp8"}
    assert first.change.startswith("KV cache fp8 (")  # with the layout it fits in


def test_blackwell_spells_fp8_kv_as_the_recipes_do() -> None:
    p = plan(_glm5(accelerator="nvidia-b200"))
    assert p.vllm is not None and p.vllm.kv_cache_dtype == "fp8_e4m3"
    assert plan(_glm5(accelerator="nvidia-a800", quantization="bf16", count=8,
                      concurrency=1, context_length=8192)).vllm.kv_cache_dtype == "auto"  # type: ignore[union-attr]


def test_other_families_keep_auto_kv() -> None:
    p = plan(PlanRequest(facts=GLM46, quantization="fp8", engine="vllm",
                         accelerator="nvidia-h100-80gb", count=8, context_length=32768))
    assert p.vllm is not None and p.vllm.kv_cache_dtype == "auto"


def test_the_argv_carries_the_layout() -> None:
    dep = vllm_argv(plan(_glm5(layout="dep")), "/m", 8000, "glm-5")
    assert dep[dep.index("--data-parallel-size") + 1] == "8"
    assert "--enable-expert-parallel" in dep
    assert dep[dep.index("--tensor-parallel-size") + 1] == "1"
    assert dep[dep.index("--max-num-seqs") + 1] == "2"
    dcp = vllm_argv(plan(_glm5(layout="dcp")), "/m", 8000, "glm-5")
    assert dcp[dcp.index("--decode-context-parallel-size") + 1] == "8"
    tp = vllm_argv(plan(_glm5(layout="tp", concurrency=4)), "/m", 8000, "glm-5")
    assert not {"--data-parallel-size", "--enable-expert-parallel",
                "--decode-context-parallel-size"} & set(tp)


def test_status_and_cli_show_the_layouts_side_by_side() -> None:
    p = plan(_glm5())
    summary = p.summary()
    assert [row["label"] for row in summary["layouts"]] == ["TP8", "TP8+DCP8", "DEP8"]
    assert {"kvCacheTokens", "requestsAtContext", "headroomBytes", "chosen"} <= set(
        summary["layouts"][0])
    from glm_operator.api.glmservice_status import PlanSummary
    parsed = PlanSummary.model_validate(summary)
    assert parsed.layouts is not None and parsed.vllm is not None
    assert parsed.vllm.layout == p.vllm.layout  # type: ignore[union-attr]
    text = format_plan(p)
    assert "TP8+DCP8" in text and "DEP8" in text and "<- chosen" in text


def test_the_glm5_family_drafts_at_the_recipes_depth() -> None:
    """vLLM's GLM-5.1 recipe and the authors' README: 3 MTP tokens; GLM-5.2's: 5."""
    assert plan(_glm5(concurrency=1)).vllm.speculative_tokens == 3  # type: ignore[union-attr]
    glm52 = replace(GLM5, context_length=1_048_576)
    assert plan(_glm5(facts=glm52, concurrency=1)).vllm.speculative_tokens == 5  # type: ignore[union-attr]


def test_the_issues_example_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """The command of issue 38, verbatim but for the facts file, and `--layout dep`."""
    from glm_operator.cli import main

    facts = tmp_path / "glm5.json"
    facts.write_text(json.dumps({k: v for k, v in asdict(GLM5).items() if v is not None}))
    argv = ["plan", "--gguf-facts", str(facts), "--quantization", "fp8", "--engine", "vllm",
            "--accelerator", "nvidia-h200", "--count", "8", "--context", "131072",
            "--concurrency", "16"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "FEASIBLE" in out and "nodes" not in out.split("verdict")[1]
    assert "TP8+DCP8  yes" in out and "<- chosen" in out
    assert main([*argv, "--layout", "dep", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["vllm"]["layout"] == "dep" and summary["vllm"]["data_parallel_size"] == 8
    assert summary["nodes"] == 1


def test_dep_with_tensor_parallelism_inside_each_rank() -> None:
    """DEP4xTP2: four DP ranks of two devices; attention split by the rank's TP, the experts
    over all eight devices, each rank's sequences on both of its devices."""
    dep8 = plan(_glm5(layout="dep", concurrency=8))
    dep4 = plan(_glm5(layout="dep", concurrency=8, rank_tensor_parallel=2))
    assert dep4.feasible and dep4.vllm is not None and dep8.vllm is not None, dep4.reason
    v = dep4.vllm
    assert (v.tensor_parallel_size, v.data_parallel_size, v.max_num_seqs) == (2, 4, 2)
    split = mem.moe_weights(GLM5, mem.weights_bytes(GLM5, "fp8").bytes)
    assert dep4.memory.weights == split.replicated // 2 + split.experts // 8
    assert dep4.memory.kv == 2 * dep8.memory.kv  # twice the sequences per rank, MLA whole
    assert [lc.label for lc in dep4.layouts][-1] == "DEP4xTP2"
    argv = vllm_argv(dep4, "/m", 8000, "glm-5")
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--data-parallel-size") + 1] == "4"
    with pytest.raises(ValueError, match="must divide count"):
        _glm5(rank_tensor_parallel=3)
    one_rank = plan(_glm5(layout="dep", rank_tensor_parallel=8))
    assert not one_rank.feasible and "two data-parallel ranks" in one_rank.reason


def test_geforce_cards_split_layers_not_tensors() -> None:
    """No NVLink on GeForce: llama.cpp gives each card whole layers (--split-mode layer),
    and the CLI says so; a vLLM TP plan on them warns."""
    p = plan(PlanRequest(facts=GLM4_9B, quantization="Q8_0", engine="llamacpp",
                         accelerator="nvidia-rtx-4060", count=2, context_length=32768))
    assert p.feasible and p.llamacpp is not None and p.llamacpp.tensor_split == (21, 20)
    assert any(line.startswith("--split-mode") and line.endswith("layer; --tensor-split 21,20")
               for line in format_plan(p).splitlines())
    tp = plan(PlanRequest(facts=GLM4_9B, quantization="bf16", engine="vllm",
                          accelerator="nvidia-rtx-4090", count=2, context_length=8192))
    assert any("no NVLink" in w for w in tp.warnings)
