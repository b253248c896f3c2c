"""Every GLM architecture of the pinned llama.cpp tree, loaded by the real llama-server.

For a tiny random-weight GGUF of each (e2e/glm_models.py: chatglm, glm4, glm4moe with a nextn
layer, glm-dsa with MLA and the DSA indexer, glm5-next with KDA layers, MLA + k-pool DSA
layers and a nextn layer), the planner's facts come from the fetch Job's header reader, the
argv is the one the operator renders for a CPU plan, and llama-server's own load log is the
truth the plan is held to, within 10 %:

- weights: the model buffer (the nextn layer's tensors are not loaded: the plan leaves them
  out, from the tensor bytes the header reader sums);
- KV: every "KV buffer" line (the MLA latent cache, the indexer key cache) plus the
  recurrent state of the KDA layers ("RS buffer");
- compute: the compute buffer.

Then a chat through the gateway, started with the stop sequences the operator renders for
the architecture, answers with the stop applied: the model's only likely tokens contain a GLM
stop sequence, so the reply is cut before it (finish_reason "stop"); the same request sent to
llama-server directly, without stops, runs to max_tokens with the stop text in it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from glm_operator.fetch.gguf_header import read_gguf_file
from glm_operator.gateway import flags as gateway_flags
from glm_operator.planning.facts import ArchitectureFacts
from glm_operator.planning.planner import Plan
from glm_operator.render.model_family import GLM_STOP_SEQUENCES, stop_sequences

from e2e.gateway_process import GatewayProcess
from e2e.glm_models import GLM_SPECS, STOP_REPLIES, STOP_TOKENS, write_glm_model
from e2e.llama import http_json
from e2e.llama_fixtures import (
    CpuCase,
    MiB,
    cpu_plan,
    llama_binary,  # noqa: F401 (fixture)
    rendered_argv,
    start_rendered,
)
from e2e.ports import free_port

pytestmark = pytest.mark.llama

TOLERANCE = 0.10
CASES = (
    CpuCase("1x4096", slots=1, context=4096),
    CpuCase("2x3072", slots=2, context=3072),
    CpuCase("2x2048-unified", slots=2, context=2048, kv_unified=True),
)
_BUFFER = re.compile(r"(model|KV|RS|compute) buffer size\s*=\s*([\d.]+) MiB")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("glm-models")
    return {name: write_glm_model(root / f"{name}.gguf", spec) for name, spec in GLM_SPECS.items()}


def facts_of(model: Path) -> ArchitectureFacts:
    """The planner's facts from what the fetch Job's header reader measures: the scalar keys,
    the per-layer arrays, the file size and the nextn layers' tensor bytes."""
    header = read_gguf_file(model)
    return ArchitectureFacts.from_gguf_metadata(
        {**header.metadata, **header.arrays}, file_size=model.stat().st_size,
        nextn_weights_bytes=header.nextn_tensor_bytes)


def buffers(log: str) -> dict[str, int]:
    """Bytes per kind of buffer in a load log (several KV lines: MLA, indexer)."""
    total = {"model": 0, "KV": 0, "RS": 0, "compute": 0}
    for kind, mib in _BUFFER.findall(log):
        total[kind] += round(float(mib) * MiB)
    return total


def _row(name: str, case: CpuCase, plan: Plan, actual: dict[str, int]) -> str:
    cells = [name, str(case)]
    for predicted, real in ((plan.memory.weights, actual["model"]),
                            (plan.memory.kv, actual["KV"] + actual["RS"]),
                            (plan.memory.compute, actual["compute"])):
        cells += [f"{predicted / MiB:.2f}", f"{real / MiB:.2f}",
                  f"{(predicted / real - 1) * 100:+.1f} %"]
    return "| " + " | ".join(cells) + " |"


def test_every_glm_architecture_is_in_the_family() -> None:
    for name in GLM_SPECS:
        assert stop_sequences(name) == GLM_STOP_SEQUENCES, name


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("name", GLM_SPECS)
def test_plan_matches_llama_server(name: str, case: CpuCase, models: dict[str, Path],
                                   llama_binary: Path, tmp_path: Path) -> None:  # noqa: F811
    model = models[name]
    facts = facts_of(model)
    assert facts.architecture == name
    plan = cpu_plan(facts, case)
    port = free_port()
    with start_rendered(rendered_argv(plan, model, port), port, llama_binary, tmp_path) as server:
        log = server.log_text()
    actual = buffers(log)
    print("\n" + _row(name, case, plan, actual))
    spec = GLM_SPECS[name]
    if spec.nextn:
        assert f"blk.{spec.n_layer}.nextn.eh_proj.weight" in log  # "unused tensor": skipped
    if spec.kda_layers:
        assert actual["RS"] > 0, "no recurrent state buffer for the KDA layers"
    for what, predicted, real in (("weights", plan.memory.weights, actual["model"]),
                                  ("KV", plan.memory.kv, actual["KV"] + actual["RS"]),
                                  ("compute", plan.memory.compute, actual["compute"])):
        assert real > 0, f"{what}: no buffer line in the log:\n{log[-3000:]}"
        assert abs(predicted - real) <= TOLERANCE * real, (
            f"{name} {case} {what}: planner {predicted / MiB:.2f} MiB, "
            f"llama-server {real / MiB:.2f} MiB")


def _chat(url: str, stop: list[str] | None = None) -> dict[str, object]:
    body: dict[str, object] = {
        "model": "glm-test", "messages": [{"role": "user", "content": "Say something"}],
        "max_tokens": 6, "temperature": 0,
    }
    if stop is not None:
        body["stop"] = stop
    status, answer = http_json(url + "/v1/chat/completions", body, timeout=120)
    assert status == 200, answer
    assert isinstance(answer, dict)
    return answer


@pytest.mark.parametrize("name", GLM_SPECS)
def test_chat_through_the_gateway_stops_at_the_family_stops(
    name: str, models: dict[str, Path], llama_binary: Path, tmp_path: Path,  # noqa: F811
) -> None:
    model = models[name]
    plan = cpu_plan(facts_of(model), CpuCase("1x1024", slots=1, context=1024))
    port = free_port()
    stops = list(stop_sequences(plan.request.facts.architecture))
    with start_rendered(rendered_argv(plan, model, port), port, llama_binary, tmp_path) as engine:
        # The engine alone, asked without stops: the stop text is in the reply, to max_tokens.
        direct = _chat(engine.url, stop=[])
        choice = direct["choices"][0]  # type: ignore[index]
        assert choice["finish_reason"] == "length", direct
        assert any(token in choice["message"]["content"] for token in STOP_TOKENS), direct
        args = gateway_flags.write({"stop": stops})
        with GatewayProcess.start(engine.url, tmp_path, args) as gateway:
            answer = _chat(gateway.url)
    choice = answer["choices"][0]  # type: ignore[index]
    assert choice["finish_reason"] == "stop", answer
    assert choice["message"]["content"] in STOP_REPLIES, answer
