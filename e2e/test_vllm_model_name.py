"""Whatever `model` an OpenAI client names, the pinned vLLM gets the name it serves.

vLLM answers 404 to any model name but its --served-model-name; llama-server ignores the
field. The real gateway stands in front of an engine whose request handling is the pinned
vLLM's own (e2e/vllm_request_check.py: vLLM's request models and its `_check_model` over the
name the operator renders), started with the names the render goldens give the engine and
the gateway; no device is needed for that code path.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.conftest import in_ci
from e2e.gateway_process import GatewayProcess
from e2e.llama import http_json
from e2e.ports import free_port
from e2e.procstat import stop
from e2e.vllm_cli import VLLM_VERSION, VllmEnvError, ensure_vllm

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "render" / "golden" / "vllm-a100x2.yaml"
CHECKER = Path(__file__).resolve().parent / "vllm_request_check.py"
MESSAGES = [{"role": "user", "content": "hi"}]


def _containers() -> dict[str, dict[str, Any]]:
    for doc in yaml.safe_load_all(GOLDEN.read_text()):
        if doc and doc.get("kind") == "Deployment":
            pod = doc["spec"]["template"]["spec"]
            return {c["name"]: c for c in pod["containers"]}
    raise AssertionError(f"{GOLDEN} has no Deployment")


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    containers = _containers()
    engine = [*containers["engine"].get("command", []), *containers["engine"]["args"]]
    gateway = containers["gateway"]["args"]
    stops = [gateway[i + 1] for i, item in enumerate(gateway) if item == "--stop"]
    return {"served": _value(engine, "--served-model-name"),
            "service": _value(gateway, "--service-name"), "stops": stops}


@pytest.fixture(scope="module")
def vllm_engine(tmp_path_factory: pytest.TempPathFactory,
                rendered: dict[str, Any]) -> Iterator[tuple[str, Path]]:
    try:
        python = ensure_vllm()
    except VllmEnvError as exc:
        if in_ci():
            pytest.fail(f"vllm=={VLLM_VERSION} could not be installed: {exc}", pytrace=False)
        pytest.skip(str(exc))
    work = tmp_path_factory.mktemp("vllm-model-name")
    port, received = free_port(), work / "received.jsonl"
    log = (work / "engine.log").open("wb")
    engine = subprocess.Popen(
        [str(python), str(CHECKER), "--port", str(port), "--served-model-name",
         rendered["served"], "--log", str(received)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        stop(engine)
        log.close()


def _gateway(engine_url: str, work: Path, service: str, stops: list[str]) -> GatewayProcess:
    args = ["--no-warmup", "--kv-cache-poll-seconds", "0"]
    for item in stops:
        args += ["--stop", item]
    # readiness waits for the engine's /health, so the vLLM side is up when this returns
    return GatewayProcess.start(engine_url, work, args, service_name=service, timeout=120)


def test_the_operator_renders_one_name_for_the_engine_and_the_gateway(
        rendered: dict[str, Any]) -> None:
    assert rendered["served"] == rendered["service"] == "chat"


@pytest.mark.parametrize("named", ["glm-5", "zai-org/GLM-5.1", "chat", None])
def test_vllm_accepts_every_request_whatever_model_the_client_names(
        vllm_engine: tuple[str, Path], rendered: dict[str, Any], tmp_path: Path,
        named: str | None) -> None:
    url, received = vllm_engine
    with _gateway(url, tmp_path, rendered["service"], rendered["stops"]) as gateway:
        chat: dict[str, Any] = {"messages": MESSAGES, "max_tokens": 4}
        completion: dict[str, Any] = {"prompt": "hi", "max_tokens": 4}
        if named is not None:
            chat["model"] = completion["model"] = named
        status, body = http_json(gateway.url + "/v1/chat/completions", chat)
        assert status == 200, body
        assert body["model"] == "chat"
        status, body = http_json(gateway.url + "/v1/completions", completion)
        assert status == 200, body
        status, models = http_json(gateway.url + "/v1/models")
        assert status == 200 and [m["id"] for m in models["data"]] == ["chat"]
    sent = [json.loads(json.loads(line)["body"]) for line in received.read_text().splitlines()]
    assert sent[-2]["model"] == sent[-1]["model"] == "chat"
    assert sent[-2]["stop"] == rendered["stops"]  # vLLM's request model took the GLM stops


def test_a_name_vllm_does_not_serve_gets_vllms_own_404(
        vllm_engine: tuple[str, Path], rendered: dict[str, Any], tmp_path: Path) -> None:
    """The control: were the engine told a name the gateway does not rewrite to, vLLM's own
    check refuses, so the cases above pass only because the gateway sends the served name."""
    url, _ = vllm_engine
    with _gateway(url, tmp_path, "not-the-served-name", []) as gateway:
        status, body = http_json(gateway.url + "/v1/chat/completions",
                                 {"model": "chat", "messages": MESSAGES})
    assert status == 404, body
    assert "The model `not-the-served-name` does not exist" in json.dumps(body)
