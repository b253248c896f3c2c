"""Stop sequences (and vLLM's GLM parsers) from the architecture, and the gateway gets them."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from glm_operator.gateway import config as gateway_config
from glm_operator.render.model_family import (
    GLM_STOP_SEQUENCES,
    VllmParsers,
    glm_generation,
    stop_sequences,
    vllm_parsers,
)
from glm_operator.render.service import render_service

from render.cases import GLM4_9B_FACTS, inputs, model_version, service


@pytest.mark.parametrize("architecture", ["glm4", "chatglm", "glm4moe", "glm-dsa", "GLM4",
                                          "glm4_moe"])
def test_glm_family_stops_at_the_next_turn(architecture: str) -> None:
    assert stop_sequences(architecture) == ("<|user|>", "<|observation|>", "<|endoftext|>")


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "deepseek2", ""])
def test_other_families_have_no_stops(architecture: str) -> None:
    assert stop_sequences(architecture) == ()


@pytest.mark.parametrize(("architecture", "names", "tool_call"), [
    ("glm4moe", ["hf://zai-org/GLM-4.5-Air-FP8"], "glm45"),
    ("glm4moe", ["hf://zai-org/GLM-4.6", "glm46"], "glm45"),
    ("glm4moe", ["s3://models/glm/weights", "glm-4-7-fp8"], "glm47"),
    ("glm4moe", ["hf://zai-org/GLM-4.7-FP8"], "glm47"),
    ("glm4moe", ["https://mirror/x.safetensors", "chat-model"], "glm45"),  # nothing says 4.7
    ("glm-dsa", ["hf://zai-org/GLM-5"], "glm47"),
    ("glm-dsa", [], "glm47"),
    ("glm5-next", [], "glm47"),
])
def test_the_tool_call_parser_follows_the_glm_generation(architecture: str, names: list[str],
                                                        tool_call: str) -> None:
    assert vllm_parsers(architecture, names) == VllmParsers(tool_call, "glm45")


@pytest.mark.parametrize("architecture", ["glm4", "chatglm", "llama", "qwen3"])
def test_older_glm_and_other_families_get_no_parsers(architecture: str) -> None:
    assert vllm_parsers(architecture, ["hf://zai-org/GLM-4.7"]) == VllmParsers(None, None)


def test_the_glmservice_overrides_or_turns_off_each_parser() -> None:
    assert vllm_parsers("glm4moe", [], "glm47", None) == VllmParsers("glm47", "glm45")
    assert vllm_parsers("glm-dsa", [], "none", "none") == VllmParsers(None, None)
    assert vllm_parsers("qwen3", [], "qwen3_xml", "qwen3") == VllmParsers("qwen3_xml", "qwen3")


def test_glm_generation_reads_the_first_name_that_says_it() -> None:
    assert glm_generation(["zai-org/GLM-4.7-FP8"]) == (4, 7)
    assert glm_generation(["glm_4.6"]) == (4, 6)
    assert glm_generation(["GLM-5.1-w8a8"]) == (5, 1)
    assert glm_generation(["llama", "glm45-air"]) == (4, 5)
    assert glm_generation(["mistral"]) is None


def _gateway_config(architecture: str, engine: str = "llamacpp") -> Any:
    accelerator = "a10"
    mv = model_version("gguf" if engine == "llamacpp" else "bf16",
                       facts={**GLM4_9B_FACTS, "architecture": architecture})
    svc = service(engine, accelerator)
    deployment = next(o for o in render_service(inputs(svc, mv)) if o["kind"] == "Deployment")
    gateway = next(c for c in deployment["spec"]["template"]["spec"]["containers"]
                   if c["name"] == "gateway")
    parser = argparse.ArgumentParser()
    gateway_config.add_arguments(parser)
    return gateway_config.from_args(parser.parse_args(gateway["args"][1:]))


def test_the_gateway_of_a_glm_model_adds_its_stops() -> None:
    assert _gateway_config("glm4").stop_sequences == GLM_STOP_SEQUENCES
    assert _gateway_config("glm4moe").stop_sequences == GLM_STOP_SEQUENCES


def test_the_gateway_of_a_llama_model_adds_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLM_GATEWAY_STOP", raising=False)
    assert _gateway_config("llama").stop_sequences == ()
