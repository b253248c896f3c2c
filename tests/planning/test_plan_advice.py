"""Advice that can be applied: the engine settings a GLMService asks for reach the plan, and
every alternative an Infeasible condition prints is a merge patch that makes the service fit.

The patches are taken out of the condition's message as a user would copy them, applied with
RFC 7386 semantics to the manifest, validated by the API types without the operator's
leniency for admitted objects, and planned again: a wrong patch fails here (the e2e test
e2e/test_applicable_advice.py sends them to the real API server).
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from dataclasses import replace
from typing import Any

import pytest
from glm_operator.api import GLMService, ModelVersion
from glm_operator.api.conversion import convert
from glm_operator.config import OperatorConfig
from glm_operator.decide.advice import infeasible_message
from glm_operator.planning.from_api import (
    applicable_alternatives,
    merge_patch,
    plan_request_for,
    spec_patch,
)
from glm_operator.planning.planner import Alternative, GiB, Plan, plan
from glm_operator.render.engine_args import engine_argv

PATCH = re.compile(r"kubectl patch glms (\S+) -n (\S+) --type merge -p '(\{[^']*\})'")

GGUF_MV: dict[str, Any] = {
    "apiVersion": "serving.glm-operator.dev/v1alpha2", "kind": "ModelVersion",
    "metadata": {"name": "glm4-9b-q4", "namespace": "ns"},
    "spec": {
        "source": {"uri": "hf://org/repo/glm-4-9b-Q4_K_M.gguf?revision=main"},
        "format": "gguf", "quantization": "Q4_K_M", "architecture": "glm4",
        "cache": {"size": "8Gi"},
        "facts": {"blockCount": 40, "embeddingLength": 4096, "headCount": 32,
                  "headCountKv": 2, "keyLength": 128, "valueLength": 128,
                  "contextLength": 32768, "vocabSize": 151552,
                  "parameterCount": 9_400_000_000, "sizeBytes": 6_170_000_000},
    },
}
HF_MV: dict[str, Any] = {
    "apiVersion": "serving.glm-operator.dev/v1alpha2", "kind": "ModelVersion",
    "metadata": {"name": "glm4-32b-bf16", "namespace": "ns"},
    "spec": {
        "source": {"uri": "hf://org/glm-4-32b?revision=main"},
        "format": "safetensors", "quantization": "bf16", "architecture": "glm4",
        "cache": {"size": "80Gi"},
        "facts": {"blockCount": 61, "embeddingLength": 6144, "headCount": 48,
                  "headCountKv": 2, "keyLength": 128, "valueLength": 128,
                  "contextLength": 32768, "vocabSize": 151552,
                  "parameterCount": 32_600_000_000},
    },
}


def manifest(mv: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A GLMService written with v1alpha1's field names, as v1alpha2 stores it."""
    return convert({
        "apiVersion": "serving.glm-operator.dev/v1alpha1", "kind": "GLMService",
        "metadata": {"name": "chat", "namespace": "ns"},
        "spec": {"modelVersion": mv["metadata"]["name"], "gateway": {"access": "Open"},
                 **spec},
    }, "serving.glm-operator.dev/v1alpha2")


def planned(svc: dict[str, Any], mv: dict[str, Any], long_context: bool = False) -> Plan:
    return plan(plan_request_for(GLMService.model_validate(svc), ModelVersion.model_validate(mv),
                                 long_context=long_context))


def patches_in(message: str, name: str = "chat") -> list[dict[str, Any]]:
    found = PATCH.findall(message)
    assert all(n == name and ns == "ns" for n, ns, _ in found), found
    return [json.loads(body) for _, _, body in found]


def assert_every_patch_fits(svc: dict[str, Any], mv: dict[str, Any], pool: str = "main",
                            others: tuple[dict[str, Any], ...] = ()) -> list[dict[str, Any]]:
    service, model = GLMService.model_validate(svc), ModelVersion.model_validate(mv)
    lc = pool == "long-context"
    infeasible = plan(plan_request_for(service, model, long_context=lc))
    assert not infeasible.feasible
    message = infeasible_message(pool, infeasible, service, model,
                                 [ModelVersion.model_validate(o) for o in others])
    patches = patches_in(message)
    assert patches, message
    versions = {mv["metadata"]["name"]: mv, **{o["metadata"]["name"]: o for o in others}}
    for patch in patches:
        patched = merge_patch(copy.deepcopy(svc), patch)
        # Strict: the API server runs every rule on the patched object.
        patched_service = GLMService.model_validate(patched)
        target = versions[patched_service.spec.model_version]
        assert planned(patched, target).feasible, patch
        if patched_service.spec.long_context and patched_service.spec.long_context.enabled:
            assert planned(patched, target, long_context=True).feasible, patch
    return patches


# --- plumbing -------------------------------------------------------------------------------


def test_the_fields_reach_the_plan_and_the_llama_server_argv() -> None:
    svc = manifest(GGUF_MV, accelerator={"profile": "nvidia-a10"}, contextLength=8192,
                   concurrency=2, kvCacheType="q8_0", kvUnified=True, loadMode="no-mmap",
                   cpuOffload={"acceleratorLayers": 30})
    p = planned(svc, GGUF_MV)
    assert p.feasible and p.llamacpp is not None
    s = p.llamacpp
    assert (s.cache_type_k, s.cache_type_v, s.flash_attn) == ("q8_0", "q8_0", True)
    assert (s.kv_unified, s.mmap, s.n_gpu_layers) == (True, False, 30)
    argv = engine_argv(p, "/models/m.gguf", 8080, "chat")
    pairs = dict(itertools.pairwise(argv))
    assert pairs["--cache-type-k"] == pairs["--cache-type-v"] == "q8_0"
    assert pairs["--flash-attn"] == "on"  # a quantized V cache needs it
    assert pairs["--n-gpu-layers"] == "30" and pairs["--load-mode"] == "none"
    assert "--kv-unified" in argv and "--no-kv-unified" not in argv


def test_offloaded_layers_are_host_memory_the_pod_requests() -> None:
    base = manifest(GGUF_MV, accelerator={"profile": "nvidia-a10"}, contextLength=8192)
    whole = planned(base, GGUF_MV)
    offloaded = planned({**base, "spec": {**base["spec"],
                                          "engine": {"llamacpp": {"acceleratorLayers": 11}}}},
                        GGUF_MV)
    # 30 of the 41 units (40 layers + output) leave the device: about 30/41 of the weights
    # and 30/41 of the KV cache, which the memory request now holds.
    moved = whole.memory.weights + whole.memory.kv - offloaded.memory.weights - offloaded.memory.kv
    grown = offloaded.resources.memory_request_bytes - whole.resources.memory_request_bytes
    assert moved > 3 * GiB
    assert abs(grown - moved) < 0.15 * moved, (grown, moved)
    assert offloaded.resources.memory_limit_bytes > offloaded.resources.memory_request_bytes
    assert any("run on the CPU" in w for w in offloaded.warnings)


def test_vllm_cpu_offload_moves_weights_to_pinned_host_memory() -> None:
    base = manifest(HF_MV, engine="vllm", accelerator={"profile": "nvidia-a100-80gb"},
                    contextLength=8192, concurrency=4)
    whole = planned(base, HF_MV)
    spec = {**base["spec"], "engine": {"vllm": {"cpuOffloadGiB": 6, "kvCacheType": "auto"}}}
    offloaded = planned({**base, "spec": spec}, HF_MV)
    assert whole.memory.weights - offloaded.memory.weights == 6 * GiB
    assert (offloaded.resources.memory_request_bytes
            - whole.resources.memory_request_bytes) == 6 * GiB  # one GPU
    argv = engine_argv(offloaded, "/models/m", 8000, "chat")
    assert argv[argv.index("--cpu-offload-gb") + 1] == "6"
    assert "--cpu-offload-gb" not in engine_argv(whole, "/models/m", 8000, "chat")


def test_vllm_fp8_kv_cache_is_rendered() -> None:
    svc = manifest(HF_MV, engine="vllm", accelerator={"profile": "nvidia-h200"},
                   kvCacheType="fp8")
    argv = engine_argv(planned(svc, HF_MV), "/models/m", 8000, "chat")
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8"


# --- what an engine cannot honour -------------------------------------------------------------


@pytest.mark.parametrize(("mv", "spec", "says"), [
    # engine unset at v1alpha1: the setting names the engine (v1alpha2 keeps each setting
    # under its engine), and that engine cannot serve the model's format
    (GGUF_MV, {"kvCacheType": "fp8"}, "vLLM serves safetensors quantizations"),
    (HF_MV, {"kvCacheType": "q8_0"}, "llama.cpp serves GGUF quantizations"),
    (GGUF_MV, {"cpuOffload": {"hostWeightsGiB": 2}}, "vLLM serves safetensors quantizations"),
    (HF_MV, {"cpuOffload": {"acceleratorLayers": 20}}, "llama.cpp serves GGUF quantizations"),
    # no flash attention: llama.cpp cannot quantize the V cache
    (GGUF_MV, {"accelerator": {"profile": "ascend-310p"}, "kvCacheType": "q4_0"},
     "ascend-310p has no flash attention"),
    # UVA offload is CUDA's
    (HF_MV, {"accelerator": {"profile": "ascend-910b"}, "cpuOffload": {"hostWeightsGiB": 2}},
     "built for CUDA"),
    (HF_MV, {"accelerator": {"profile": "nvidia-h200"}, "cpuOffload": {"hostWeightsGiB": 4000}},
     "is not below the"),
    (HF_MV, {"accelerator": {"profile": "nvidia-a100-80gb"}, "kvCacheType": "fp8"},
     "no fp8 KV cache"),
])
def test_settings_an_engine_cannot_honour_are_refused_with_the_field(
        mv: dict[str, Any], spec: dict[str, Any], says: str) -> None:
    svc = manifest(mv, **{"accelerator": {"profile": "nvidia-h200"}, **spec})
    p = planned(svc, mv)
    assert not p.feasible
    assert says in p.reason, p.reason


# --- the patches ------------------------------------------------------------------------------


def test_every_llamacpp_alternative_is_a_patch_that_fits() -> None:
    svc = manifest(GGUF_MV, engine="llamacpp", accelerator={"profile": "nvidia-a10"},
                   contextLength=32768, concurrency=24)
    patches = assert_every_patch_fits(svc, GGUF_MV)
    specs = [p["spec"] for p in patches]
    engines = [s["engine"]["llamacpp"] for s in specs if "engine" in s]
    assert any(set(e) == {"kvCacheType"} for e in engines), specs
    assert any("acceleratorLayers" in e for e in engines), specs
    assert any("concurrency" in s for s in specs) and any("contextLength" in s for s in specs)
    assert any("accelerator" in s for s in specs)


def test_every_vllm_alternative_is_a_patch_that_fits() -> None:
    svc = manifest(HF_MV, engine="vllm", accelerator={"profile": "nvidia-a100-80gb"},
                   contextLength=16384, concurrency=16)
    patches = assert_every_patch_fits(svc, HF_MV)
    specs = [p["spec"] for p in patches]
    assert any(s.get("engine", {}).get("vllm", {}).get("cpuOffloadGiB") for s in specs), specs


def test_a_patch_replaces_the_other_offload_form_and_keeps_the_rest() -> None:
    svc = GLMService.model_validate(manifest(
        GGUF_MV, accelerator={"profile": "nvidia-a10", "count": 1},
        cpuOffload={"acceleratorLayers": 5}))
    assert spec_patch(svc, {"gpu_layers": 12}) == {
        "spec": {"engine": {"llamacpp": {"acceleratorLayers": 12}}}}
    assert spec_patch(svc, {"gpu_layers": None, "nodes": 2, "count": 4}) == {
        "spec": {"accelerator": {"count": 4, "nodes": 2},
                 "engine": {"llamacpp": {"acceleratorLayers": None}}}}
    assert spec_patch(svc, {"cpu_offload_gib": 4}) is None  # vLLM's, not this engine's
    assert spec_patch(svc, {"quantization": "Q2_K"}) is None  # the ModelVersion's


def test_offload_is_dropped_by_a_multi_node_patch() -> None:
    # An offloaded replica that still does not fit: the multi-node alternative must remove
    # the engine's CPU offload, which the API refuses beside nodes > 1.
    mv = copy.deepcopy(HF_MV)
    mv["spec"]["facts"]["parameterCount"] = 1_000_000_000_000
    mv["spec"]["cache"]["accessMode"] = "ReadWriteMany"  # every node of a group mounts it
    svc = manifest(mv, engine="vllm", accelerator={"profile": "nvidia-h200", "count": 8},
                   cpuOffload={"hostWeightsGiB": 4})
    patches = assert_every_patch_fits(svc, mv)
    multi = [p for p in patches if p["spec"].get("accelerator", {}).get("nodes")]
    assert multi and all(p["spec"]["engine"]["vllm"]["cpuOffloadGiB"] is None
                         for p in multi), patches


def test_no_patch_trades_infeasible_for_a_cache_one_node_cannot_share() -> None:
    # The same model on a ReadWriteOnce cache: one node mounts it, so a group of nodes could
    # never load it (CacheNotShareable); the multi-node alternative is no advice there.
    mv = copy.deepcopy(HF_MV)
    mv["spec"]["facts"]["parameterCount"] = 1_000_000_000_000
    svc = manifest(mv, engine="vllm", accelerator={"profile": "nvidia-h200", "count": 8})
    service, model = GLMService.model_validate(svc), ModelVersion.model_validate(mv)
    infeasible = plan(plan_request_for(service, model))
    assert any("nodes" in a.settings for a in infeasible.alternatives)
    message = infeasible_message("main", infeasible, service, model)
    assert all("nodes" not in p["spec"].get("accelerator", {}) for p in patches_in(message))


def test_long_context_pool_patches_touch_only_that_pool() -> None:
    svc = manifest(GGUF_MV, engine="llamacpp", accelerator={"profile": "nvidia-a10"},
                   contextLength=8192, concurrency=2,
                   longContext={"enabled": True, "contextLength": 32768, "concurrency": 12})
    assert planned(svc, GGUF_MV).feasible
    patches = assert_every_patch_fits(svc, GGUF_MV, pool="long-context")
    for p in patches:
        spec = p["spec"]
        assert "contextLength" not in spec and "concurrency" not in spec, p
        assert "accelerator" not in spec, p  # the pool gets its own accelerator instead
        assert "nodes" not in json.dumps(spec.get("longContext", {}).get("accelerator", {})) \
            or spec["longContext"]["accelerator"]["nodes"] == 1
    own = [p for p in patches if "accelerator" in p["spec"].get("longContext", {})]
    assert own and all(p["spec"]["longContext"]["accelerator"]["profile"] for p in own)


def test_a_smaller_quantization_is_a_patch_only_with_its_model_version() -> None:
    f16 = copy.deepcopy(GGUF_MV)
    f16["metadata"]["name"] = "glm4-9b-f16"
    f16["spec"]["quantization"] = "F16"
    f16["spec"]["facts"].pop("sizeBytes")
    svc = manifest(f16, engine="llamacpp", accelerator={"profile": "nvidia-a10"},
                   contextLength=32768, concurrency=4)
    service, model = GLMService.model_validate(svc), ModelVersion.model_validate(f16)
    infeasible = plan(plan_request_for(service, model))
    quant = next(a for a in infeasible.alternatives if set(a.settings) == {"quantization"})
    message = infeasible_message("main", infeasible, service, model)
    assert f"{quant.change[0].upper()}{quant.change[1:]} would fit" in message
    assert "create a ModelVersion of that file" in message

    smaller = copy.deepcopy(f16)
    smaller["metadata"]["name"] = "glm4-9b-small"
    smaller["spec"]["quantization"] = quant.settings["quantization"]
    applied, _ = applicable_alternatives(service, model, infeasible,
                                         [ModelVersion.model_validate(smaller)])
    assert {"spec": {"modelVersion": "glm4-9b-small"}} in [a.patch for a in applied]
    assert_every_patch_fits(svc, f16, others=(smaller,))


def test_a_model_version_of_another_model_is_not_offered() -> None:
    svc = manifest(GGUF_MV, engine="llamacpp", accelerator={"profile": "nvidia-a10"},
                   contextLength=32768, concurrency=24)
    service, model = GLMService.model_validate(svc), ModelVersion.model_validate(GGUF_MV)
    infeasible = plan(plan_request_for(service, model))
    other = copy.deepcopy(GGUF_MV)
    other["metadata"]["name"] = "another-model"
    other["spec"]["quantization"] = "Q2_K"
    other["spec"]["facts"]["blockCount"] = 28
    applied, _ = applicable_alternatives(service, model, infeasible,
                                         [ModelVersion.model_validate(other)])
    assert all("modelVersion" not in a.patch["spec"] for a in applied)


def test_a_patch_the_api_refuses_is_not_offered() -> None:
    # The long-context pool's context cannot go below the main pool's: a smaller context
    # that would fit the pool is no advice.
    svc = GLMService.model_validate(manifest(
        GGUF_MV, accelerator={"profile": "nvidia-a10"}, contextLength=16384,
        longContext={"enabled": True, "contextLength": 32768}))
    assert spec_patch(svc, {"context_length": 8192}, long_context=True) == {
        "spec": {"longContext": {"contextLength": 8192}}}
    model = ModelVersion.model_validate(GGUF_MV)
    pool_plan = plan(plan_request_for(svc, model, long_context=True))
    bad = Alternative("context 8192", {"context_length": 8192}, GiB, pool_plan)
    applied, left = applicable_alternatives(svc, model, replace(pool_plan, alternatives=(bad,)))
    assert not applied and left == [bad]


def test_no_patch_moves_the_service_to_nodes_its_images_have_no_build_for() -> None:
    svc = manifest(GGUF_MV, engine="llamacpp", accelerator={"profile": "nvidia-a10"},
                   contextLength=32768, concurrency=24)
    service, model = GLMService.model_validate(svc), ModelVersion.model_validate(GGUF_MV)
    moved = {"spec": {"accelerator": {"profile": "nvidia-a100-40gb"}}}
    # Its nodes said to be arm64: the CUDA llama.cpp image (amd64 only) cannot run there.
    arm64_a100 = OperatorConfig(acceleratorProfiles={"nvidia-a100-40gb":
                                                     {"architectures": ["arm64"]}})
    infeasible = plan(plan_request_for(service, model), arm64_a100.profiles)
    message = infeasible_message("main", infeasible, service, model, (),
                                 arm64_a100.profiles, arm64_a100)
    assert moved not in patches_in(message), message
    assert {"spec": {"accelerator": {"count": 2}}} in patches_in(message)  # others stay
    # control: the default config offers the move
    default = OperatorConfig()
    infeasible = plan(plan_request_for(service, model), default.profiles)
    assert moved in patches_in(infeasible_message("main", infeasible, service, model, (),
                                                  default.profiles, default))
