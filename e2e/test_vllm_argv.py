"""The vLLM argv the operator renders, parsed by the pinned vLLM's own command line.

Every `vllm serve` container in the render goldens (single node, NVIDIA and Ascend; multi-node
groups as StatefulSets and as LeaderWorkerSets, pipeline parallel over Ray) and in the
rendered examples goes through vLLM's real `vllm` entry point (e2e/vllm_cli_parse.py): its
parser, `validate_parsed_serve_args`, and the `AsyncEngineArgs` that `vllm serve` builds from
the parsed arguments. A flag vLLM does not know, a value it refuses or a parser name it lacks
fails here, as test_engine_argv.py does for llama-server. The Ascend containers run vLLM's own
CLI too (vllm-ascend is a platform plugin; it adds no serve flags). vLLM is given its CPU
platform (it picks one by probing hardware, and builds no parser on none): flags parse the
same on every platform.

What this cannot check without an accelerator: `create_engine_config()` (it reads the model's
config.json and probes the device), so device-dependent refusals are out of scope.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from glm_operator.render.service import Capabilities

from e2e.conftest import in_ci
from e2e.examples import example_folders, render_example
from e2e.vllm_cli import VLLM_VERSION, VllmEnvError, ensure_vllm, parse_with_vllm

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "render" / "golden"

# Rendered flag -> how its text reads, and whether it must reach the engine's arguments
# (AsyncEngineArgs) or stays with the API server (the parsed namespace only).
def _json_object(value: Any) -> dict[str, Any]:
    """A --speculative-config as rendered (JSON text) or as vLLM holds it (a dict)."""
    parsed = json.loads(value) if isinstance(value, str) else value
    assert isinstance(parsed, dict), value
    return parsed


FLAGS: dict[str, tuple[Any, bool]] = {
    "--served-model-name": (str, True),
    "--host": (str, False),
    "--port": (int, False),
    "--tensor-parallel-size": (int, True),
    "--pipeline-parallel-size": (int, True),
    "--distributed-executor-backend": (str, True),
    "--max-model-len": (int, True),
    "--max-num-seqs": (int, True),
    "--max-num-batched-tokens": (int, True),
    "--gpu-memory-utilization": (float, True),
    "--kv-cache-dtype": (str, True),
    "--dtype": (str, True),
    "--tool-call-parser": (str, False),
    "--reasoning-parser": (str, True),
    # MTP speculative decoding: the JSON object vLLM parsed, key by key
    "--speculative-config": (_json_object, True),
    # issue 38's layouts: DEP (data-parallel attention, expert parallel) and DCP
    "--data-parallel-size": (int, True),
    "--decode-context-parallel-size": (int, True),
    # issue 38's host-memory KV tier (GiB, a float to vLLM) and its backend
    "--kv-offloading-size": (float, True),
    "--kv-offloading-backend": (str, True),
}
SWITCHES = {"--enable-auto-tool-choice": ("namespace", "enable_auto_tool_choice"),
            "--enable-expert-parallel": ("engine", "enable_expert_parallel")}


def _pod_specs(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    spec = obj.get("spec", {})
    if "template" in spec:
        yield "", spec["template"].get("spec", {})
    group = spec.get("leaderWorkerTemplate", {})
    for role in ("leaderTemplate", "workerTemplate"):
        if role in group:
            yield f"{role}/", group[role].get("spec", {})


def vllm_argvs(objects: list[dict[str, Any]], source: str) -> dict[str, list[str]]:
    """{case: argv} of every container that runs `vllm serve` or `ray`, and of every
    postStart hook that runs `ray` (a group leader's Ray head)."""
    found: dict[str, list[str]] = {}
    for obj in objects:
        for role, pod in _pod_specs(obj):
            for container in pod.get("containers", []):
                name = f"{source}:{obj['kind']}/{obj['metadata']['name']}/{role}{container['name']}"
                argv = [str(a) for a in (*container.get("command", []),
                                         *container.get("args", []))]
                if argv[:2] == ["vllm", "serve"] or argv[:1] == ["ray"]:
                    found[name] = argv
                hook = container.get("lifecycle", {}).get("postStart", {}).get("exec", {})
                if hook.get("command", [])[:1] == ["ray"]:
                    found[name + "/postStart"] = [str(a) for a in hook["command"]]
    return found


def is_vllm(argv: list[str]) -> bool:
    return argv[:2] == ["vllm", "serve"]


def golden_cases() -> dict[str, list[str]]:
    cases: dict[str, list[str]] = {}
    for path in sorted(GOLDEN.glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        cases.update(vllm_argvs(docs, path.stem))
    return cases


def example_cases() -> dict[str, list[str]]:
    cases: dict[str, list[str]] = {}
    for folder in example_folders():
        objects = render_example(folder, Capabilities(service_monitor=True))
        cases.update(vllm_argvs(objects, f"examples/{folder.name}"))
    return cases


def layout_cases() -> dict[str, list[str]]:
    """GLM-5 on 8 x H200 in each layout the planner weighs (planning/planner.py LAYOUTS), as
    `vllm_argv` renders them: no golden holds DEP or DCP yet."""
    from glm_operator.planning.facts import ArchitectureFacts
    from glm_operator.planning.planner import LAYOUTS, PlanRequest, plan
    from glm_operator.render.engine_args import vllm_argv

    glm5 = ArchitectureFacts(
        architecture="glm-dsa", block_count=78, embedding_length=6144, head_count=64,
        head_count_kv=1, key_length=576, value_length=512, context_length=202752,
        kv_lora_rank=512, rope_dimension_count=64, indexer_head_count=32,
        indexer_key_length=128, nextn_predict_layers=1, expert_count=256, expert_used_count=8,
        parameter_count=744_000_000_000, vocab_size=154880, feed_forward_length=12288,
        expert_feed_forward_length=2048, leading_dense_block_count=3)
    cases: dict[str, list[str]] = {}
    for layout in LAYOUTS:
        p = plan(PlanRequest(facts=glm5, quantization="fp8", engine="vllm",
                             accelerator="nvidia-h200", count=8, context_length=131072,
                             concurrency=4, layout=layout))
        assert p.feasible and p.vllm is not None and p.vllm.layout == layout, p.reason
        cases[f"layout:{layout}"] = vllm_argv(p, "/models/glm-5", 8000, "glm-5")
    p = plan(PlanRequest(facts=glm5, quantization="fp8", engine="vllm",
                         accelerator="nvidia-h200", count=8, context_length=131072,
                         concurrency=4, layout="dep", rank_tensor_parallel=2))
    assert p.feasible and p.vllm is not None, p.reason
    cases["layout:dep4xtp2"] = vllm_argv(p, "/models/glm-5", 8000, "glm-5")
    # The host KV tier (spec.engine.vllm.kvOffloadGiB) where TP8 alone holds too few of 16.
    p = plan(PlanRequest(facts=glm5, quantization="fp8", engine="vllm",
                         accelerator="nvidia-h200", count=8, context_length=131072,
                         concurrency=16, layout="tp", kv_offload_gib=80))
    assert p.feasible and p.vllm is not None and p.vllm.kv_offloading_size == 80, p.reason
    cases["kv-offload:tp8"] = vllm_argv(p, "/models/glm-5", 8000, "glm-5")
    return cases


def flag_values(argv: list[str]) -> dict[str, str | None]:
    """--flag -> its value (None for a switch), from `vllm serve MODEL --flag value ...`."""
    values: dict[str, str | None] = {}
    rest = argv[3:]
    for index, item in enumerate(rest):
        if item.startswith("--"):
            following = rest[index + 1] if index + 1 < len(rest) else None
            values[item] = None if following is None or following.startswith("--") else following
    return values


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    try:
        return ensure_vllm()
    except VllmEnvError as exc:
        message = f"vllm=={VLLM_VERSION} could not be installed: {exc}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="module")
def cases() -> dict[str, list[str]]:
    found = {**golden_cases(), **example_cases(), **layout_cases()}
    # What the renderer makes today; a golden or example gone silently would shrink the check.
    assert any("groups-vllm" in c for c in found) and any("lws-vllm" in c for c in found)
    assert any("910b" in c for c in found) and any(c.startswith("examples/") for c in found)
    assert any(argv[:1] == ["ray"] for argv in found.values())
    return found


def _with_value(argv: list[str], flag: str, value: str) -> list[str]:
    at = argv.index(flag)
    return [*argv[:at + 1], value, *argv[at + 2:]]


@pytest.fixture(scope="module")
def parsed(vllm_python: Path, cases: dict[str, list[str]]) -> dict[str, Any]:
    # Controls ride along: a flag vLLM does not know, and parser names it lacks.
    glm = next(argv for argv in cases.values() if "--tool-call-parser" in argv)
    ray = next(argv for argv in cases.values() if argv[:1] == ["ray"])
    controls = {
        "control:unknown-flag": [*glm, "--no-such-vllm-flag", "1"],
        "control:unknown-ray-flag": [*ray, "--no-such-ray-flag"],
        "control:unknown-reasoning-parser": _with_value(glm, "--reasoning-parser", "nope-r"),
        "control:unknown-tool-parser": _with_value(glm, "--tool-call-parser", "nope-t"),
    }
    return parse_with_vllm(vllm_python, {**cases, **controls})


def test_the_pinned_vllm_ran(parsed: dict[str, Any]) -> None:
    assert parsed["vllm"] == VLLM_VERSION


def test_vllm_refuses_what_it_does_not_know(parsed: dict[str, Any]) -> None:
    """Without this, a harness that accepted anything would pass every case below."""
    for control, named in (("unknown-flag", "--no-such-vllm-flag"),
                           ("unknown-ray-flag", "--no-such-ray-flag"),
                           ("unknown-reasoning-parser", "nope-r"),
                           ("unknown-tool-parser", "nope-t")):
        result = parsed["results"][f"control:{control}"]
        assert not result["ok"] and named in result["error"], (control, result)


def test_every_rendered_vllm_argv_is_accepted_by_vllm(
        cases: dict[str, list[str]], parsed: dict[str, Any]) -> None:
    refused = {case: parsed["results"][case]["error"] for case in cases
               if not parsed["results"][case]["ok"]}
    assert refused == {}, f"vllm {VLLM_VERSION} refused rendered argvs: {refused}"


def test_every_rendered_flag_is_a_whole_vllm_option(
        cases: dict[str, list[str]], parsed: dict[str, Any]) -> None:
    """argparse accepts a prefix of an option; the renderer must write the whole name, or a
    new vLLM option sharing the prefix would make the flag ambiguous."""
    options = set(parsed["serve_options"])
    assert "--tensor-parallel-size" in options
    partial = {case: sorted(set(flag_values(argv)) - options) for case, argv in cases.items()
               if is_vllm(argv)}
    assert {case: flags for case, flags in partial.items() if flags} == {}


def test_vllm_reads_the_values_the_plan_rendered(
        cases: dict[str, list[str]], parsed: dict[str, Any]) -> None:
    for case, argv in cases.items():
        if not is_vllm(argv):
            continue
        result = parsed["results"][case]
        engine_args, namespace = result["engine_args"], result["namespace"]
        assert engine_args["model"] == parsed["model_dir"], case  # the model path argument
        flags = flag_values(argv)
        unchecked = set(flags) - set(FLAGS) - set(SWITCHES)
        assert not unchecked, f"{case}: add {sorted(unchecked)} to FLAGS"
        for flag, value in flags.items():
            if flag not in FLAGS or value is None:
                continue
            kind, reaches_engine = FLAGS[flag]
            dest = flag[2:].replace("-", "_")
            places = [("namespace", namespace)] + ([("engine", engine_args)]
                                                   if reaches_engine else [])
            for where, values in places:
                seen = values[dest]
                if isinstance(seen, list):  # --served-model-name takes several names
                    seen = seen[0]
                assert kind(seen) == kind(value), f"{case}: {flag} {value} -> {where} {seen!r}"
        for switch, (where, dest) in SWITCHES.items():
            if switch in flags:
                assert (engine_args if where == "engine" else namespace)[dest] is True, case
        # Every multi-node vLLM argv spans nodes through Ray (engine_args.py says why).
        if int(flags.get("--pipeline-parallel-size") or 1) > 1:
            assert engine_args["distributed_executor_backend"] == "ray", case


def test_ray_reads_the_group_it_was_rendered_for(
        cases: dict[str, list[str]], parsed: dict[str, Any]) -> None:
    """The leader's head listens where the workers and the engine look for it."""
    rays = {case: parsed["results"][case]["namespace"] for case, argv in cases.items()
            if argv[:1] == ["ray"]}
    heads = [p for p in rays.values() if p["head"]]
    workers = [p for p in rays.values() if not p["head"]]
    assert heads and workers
    (port,) = {p["port"] for p in heads}
    for params in workers:
        assert params["address"].rsplit(":", 1)[1] == str(port)
        assert params["block"] is True
