"""Stop sequences (and vLLM's GLM parsers) from the architecture, and the gateway gets them."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from glm_operator.gateway import config as gateway_config
from glm_operator.render.model_family import (
    GLM_STOP_SEQUENCES,
    stop_sequences,
    uses_vllm_glm45_parsers,
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


def test_vllm_glm45_parsers_only_for_glm45_and_later() -> None:
    assert uses_vllm_glm45_parsers("glm4moe") and uses_vllm_glm45_parsers("glm-dsa")
    assert not uses_vllm_glm45_parsers("glm4") and not uses_vllm_glm45_parsers("llama")


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
