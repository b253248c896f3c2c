"""Every architecture the operator accepts for an engine is one that engine's pinned version
loads: the llama.cpp names against the pinned tree's own LLM_ARCH_NAMES, the vLLM classes
against the pinned vLLM's own model registry (planning/engine_support.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from glm_operator.api import vllm_names
from glm_operator.fetch.hf_config import HF_TO_GGUF_ARCHITECTURE
from glm_operator.planning import engine_support
from glm_operator.render import model_family

from e2e.conftest import in_ci
from e2e.llama_tree import architecture_names, llama_cpp_python_version, pinned_tree
from e2e.vllm_cli import VLLM_VERSION, VllmEnvError, ensure_vllm

# Run by the pinned vLLM's Python: {class: module} for every model class its registry serves.
REGISTRY_SCRIPT = """
import json
from vllm.model_executor.models.registry import _VLLM_MODELS
from vllm.reasoning import ReasoningParserManager
from vllm.tool_parsers import ToolParserManager
print("REGISTRY " + json.dumps({name: entry[0] for name, entry in _VLLM_MODELS.items()}))
print("PARSERS " + json.dumps({"tool_call": sorted(ToolParserManager.list_registered()),
                               "reasoning": sorted(ReasoningParserManager.list_registered())}))
"""


@pytest.fixture(scope="module")
def tree() -> Path:
    return pinned_tree()


@pytest.fixture(scope="module")
def vllm_lists() -> dict[str, Any]:
    try:
        python = ensure_vllm()
    except VllmEnvError as exc:
        if in_ci():
            pytest.fail(f"vllm=={VLLM_VERSION} could not be installed: {exc}", pytrace=False)
        pytest.skip(str(exc))
    done = subprocess.run([str(python), "-c", REGISTRY_SCRIPT], capture_output=True, text=True,
                          timeout=300, check=True)
    found: dict[str, Any] = {}
    for line in done.stdout.splitlines():
        mark, _, rest = line.partition(" ")
        if mark in ("REGISTRY", "PARSERS"):
            found[mark] = json.loads(rest)
    return found


@pytest.fixture(scope="module")
def vllm_registry(vllm_lists: dict[str, Any]) -> dict[str, str]:
    registry: dict[str, str] = vllm_lists["REGISTRY"]
    return registry


def test_the_crd_offers_exactly_the_pinned_vllms_parsers(vllm_lists: dict[str, Any]) -> None:
    parsers = vllm_lists["PARSERS"]
    assert "glm47" in parsers["tool_call"] and "glm45" in parsers["reasoning"]
    assert sorted(vllm_names.VLLM_TOOL_CALL_PARSERS) == parsers["tool_call"]
    assert sorted(vllm_names.VLLM_REASONING_PARSERS) == parsers["reasoning"]


def test_the_table_names_the_pinned_llama_cpp() -> None:
    assert f"llama-cpp-python {llama_cpp_python_version()}" == engine_support.LLAMA_CPP_VERSION


def test_llama_cpp_accepts_exactly_what_the_pinned_tree_registers(tree: Path) -> None:
    registered = set(architecture_names(tree)) - {"clip", "(unknown)"}
    assert len(registered) > 100  # the parse found the table, not an empty match
    assert registered == engine_support.LLAMACPP_ARCHITECTURES
    for name in sorted(registered):
        assert engine_support.unsupported("llamacpp", name) is None


def test_every_glm_architecture_is_in_the_pinned_tree(tree: Path) -> None:
    registered = set(architecture_names(tree))
    for name in ("chatglm", "glm4", "glm4moe", "glm-dsa", "glm5-next"):
        assert name in registered
    # What the fetch names a safetensors model, llama.cpp names the same way.
    for cls, name in HF_TO_GGUF_ARCHITECTURE.items():
        assert name in registered, (cls, name)


def test_a_name_the_tree_lacks_is_refused_naming_engine_version_and_architecture() -> None:
    why = engine_support.unsupported("llamacpp", "glm4v")
    assert why and "llama.cpp" in why and "0.3.36" in why and "'glm4v'" in why


def test_the_pinned_vllm_registers_every_class_the_operator_names(
        vllm_registry: dict[str, str]) -> None:
    assert vllm_registry["LlamaForCausalLM"] == "llama"  # the registry was read, not empty
    for name, classes in engine_support.VLLM_ARCHITECTURES.items():
        for cls in classes:
            # Natively, not through vLLM's Transformers fallback.
            assert vllm_registry.get(cls) not in (None, "transformers"), (name, cls)
    for cls, name in HF_TO_GGUF_ARCHITECTURE.items():
        assert name in engine_support.VLLM_ARCHITECTURES, (cls, name)
        assert cls in vllm_registry, cls


def test_glm_5_is_in_the_pinned_vllm(vllm_registry: dict[str, str]) -> None:
    for cls in ("GlmMoeDsaForCausalLM", "Glm5NextForCausalLM", "Glm4MoeForCausalLM"):
        assert cls in vllm_registry
    for name in model_family.GLM_CHAT_ARCHITECTURES:
        if name in engine_support.VLLM_ARCHITECTURES:
            assert all(c in vllm_registry for c in engine_support.VLLM_ARCHITECTURES[name])
