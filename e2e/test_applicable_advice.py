"""Advice that can be applied, on the real API server: every alternative an Infeasible
condition proposes is a `kubectl patch` command; each command, run as printed by the real
kubectl against the real CRD (schema, CEL rules), turns the plan feasible and the operator
renders the pods.

One GLMService per proposed patch, all created alike: each is patched with the command its
own condition prints (the command names the object), so a patch that the API server refuses,
that changes the wrong field, or that does not make the plan fit fails here.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from glm_operator.api import GLMService, ModelVersion
from glm_operator.planning.from_api import plan_request_for
from glm_operator.planning.planner import plan as make_plan
from glm_operator.render.engine_args import engine_argv

from e2e.conftest import in_ci
from e2e.kubectl import Kubectl
from e2e.llama import http_json
from e2e.llama_fixtures import (
    LoadReport,
    facts_of,
    llama_binary,
    rendered_argv,
    start_rendered,
)
from e2e.models import TinyLlamaSpec, write_tiny_llama
from e2e.operator_fixtures import OperatorProcess, glm_crds, operator, report_fetched
from e2e.ports import free_port
from e2e.vllm_cli import VLLM_VERSION, VllmEnvError, ensure_vllm, parse_with_vllm

__all__ = ["glm_crds", "llama_binary", "operator"]  # fixtures used by name

Wait = Callable[..., Any]
SERVICE_LABEL = "glm-operator.dev/service"
POOL_LABEL = "glm-operator.dev/pool"
PATCH = re.compile(r"kubectl patch glms \S+ -n \S+ --type merge -p '\{[^']*\}'")
API = "serving.glm-operator.dev/v1alpha2"

GLM4_9B_FACTS = {"blockCount": 40, "embeddingLength": 4096, "headCount": 32, "headCountKv": 2,
                 "keyLength": 128, "valueLength": 128, "contextLength": 32768,
                 "vocabSize": 151552, "parameterCount": 9_400_000_000}
GLM4_32B_FACTS = {"blockCount": 61, "embeddingLength": 6144, "headCount": 48, "headCountKv": 2,
                  "keyLength": 128, "valueLength": 128, "contextLength": 32768,
                  "vocabSize": 151552, "parameterCount": 32_566_800_000}


def model_version(name: str, fmt: str, quantization: str, facts: dict[str, Any],
                  cache: str) -> dict[str, Any]:
    uri = (f"hf://org/glm-4-9b-gguf/glm-4-9b-{quantization}.gguf?revision=main"
           if fmt == "gguf" else "hf://org/glm-4-32b?revision=main")
    return {"apiVersion": API, "kind": "ModelVersion", "metadata": {"name": name},
            "spec": {"source": {"uri": uri}, "format": fmt, "quantization": quantization,
                     "architecture": "glm4", "cache": {"size": cache}, "facts": facts}}


def service(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "GLMService", "metadata": {"name": name},
            "spec": {"gateway": {"access": "Open"}, "replicas": 1, **spec}}


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_),
                None)


def fetched(kubectl: Kubectl, ns: str, mv: dict[str, Any], size: int, wait_for: Wait) -> None:
    kubectl.apply(mv, namespace=ns)
    name = mv["metadata"]["name"]
    wait_for(lambda: kubectl.items("jobs", "-n", ns, "-l",
                                   f"glm-operator.dev/model-version={name}"),
             timeout=60, what=f"the fetch Job of ModelVersion {name}")
    report_fetched(kubectl, ns, name, size=size)


def planned(kubectl: Kubectl, ns: str, name: str, status: str, wait_for: Wait) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        cond = condition(kubectl.get_json("glmservice", name, "-n", ns), "Planned")
        return cond if cond and cond["status"] == status else None
    # A bound, not a speed: copies of one infeasible service are planned together with every
    # alternative each, on two cores the rest of the suite shares (90 s ran out once in CI).
    found: dict[str, Any] = wait_for(reached, timeout=300, what=f"{name} Planned={status}")
    return found


def proposed_patches(kubectl: Kubectl, ns: str, name: str, wait_for: Wait) -> list[str]:
    cond = planned(kubectl, ns, name, "False", wait_for)
    assert cond["reason"] == "Infeasible", cond
    commands = PATCH.findall(cond["message"])
    assert commands, cond["message"]
    for command in commands:
        assert f" glms {name} -n {ns} " in command, command
    return commands


def engine_args(kubectl: Kubectl, ns: str, name: str, wait_for: Wait,
                pool: str = "main") -> list[str]:
    """The engine container's argv in the pool's rendered Deployment, once the main pool's
    pods exist (a long-context pool sleeps at zero replicas)."""
    selector = f"{SERVICE_LABEL}={name},{POOL_LABEL}={pool}"
    deployments = wait_for(lambda: kubectl.items("deployments", "-n", ns, "-l", selector),
                           timeout=90, what=f"the {pool} Deployment of {name}")
    main = f"{SERVICE_LABEL}={name},{POOL_LABEL}=main"
    wait_for(lambda: kubectl.items("pods", "-n", ns, "-l", main), timeout=90,
             what=f"the pods of {name}")
    for container in deployments[0]["spec"]["template"]["spec"]["containers"]:
        argv = [str(a) for a in (*container.get("command", []), *container.get("args", []))]
        if argv[:1] == ["llama-server"] or argv[:2] == ["vllm", "serve"]:
            return argv
    raise AssertionError(f"no engine container in {deployments[0]['metadata']['name']}")


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def apply_each_patch(kubectl: Kubectl, ns: str, base: dict[str, Any], count: int,
                     wait_for: Wait, pool: str = "main",
                     ) -> list[tuple[dict[str, Any], dict[str, Any], list[str]]]:
    """Create `count` copies of `base`, run on copy i the i-th command its condition prints,
    and return (patch, status.plan, engine argv) of each once it is planned."""
    copies = []
    for i in range(count):
        item = copy.deepcopy(base)
        item["metadata"]["name"] = f"{base['metadata']['name']}-{i}"
        copies.append(item)
    kubectl.apply(copies, namespace=ns)
    results = []
    for i, item in enumerate(copies):
        name = item["metadata"]["name"]
        commands = proposed_patches(kubectl, ns, name, wait_for)
        assert len(commands) == count, commands  # the same advice for the same spec
        argv = shlex.split(commands[i])
        assert argv[0] == "kubectl"
        kubectl(*argv[1:])  # exactly as printed: a patch the API server refuses fails here
        patch = json.loads(argv[-1])
        cond = planned(kubectl, ns, name, "True", wait_for)
        assert cond["reason"] == "Planned", cond
        obj = kubectl.get_json("glmservice", name, "-n", ns)
        assert obj["status"]["plan"]["feasible"] is True, obj["status"]["plan"]
        results.append((patch, obj["status"]["plan"],
                        engine_args(kubectl, ns, name, wait_for, pool)))
    return results


def test_llamacpp_advice_applied_as_printed(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    # GLM-4-9B at F16 on one A10 with 4 x 32k contexts: short by about 2 GiB. A Q8_0
    # ModelVersion of the same model is in the namespace, so the smaller quantization is a
    # patch too (onto spec.modelVersion).
    f16 = model_version("glm4-9b-f16", "gguf", "F16", GLM4_9B_FACTS, "24Gi")
    q8 = model_version("glm4-9b-q8", "gguf", "Q8_0", GLM4_9B_FACTS, "12Gi")
    fetched(kubectl, namespace, f16, 18_800_000_000, wait_for)
    fetched(kubectl, namespace, q8, 9_990_000_000, wait_for)
    base = service("advice", modelVersion="glm4-9b-f16", engine={"llamacpp": {}},
                   accelerator={"profile": "nvidia-a10"}, contextLength=32768, concurrency=4)
    kubectl.apply(base, namespace=namespace)
    commands = proposed_patches(kubectl, namespace, "advice", wait_for)
    assert not kubectl.items("deployments", "-n", namespace, "-l", f"{SERVICE_LABEL}=advice")
    before = kubectl.get_json("glmservice", "advice", "-n", namespace)["status"]["plan"]
    units = GLM4_9B_FACTS["blockCount"] + 1  # -ngl counts the output layer

    results = apply_each_patch(kubectl, namespace, base, len(commands), wait_for)
    kinds = set()
    for patch, plan, argv in results:
        spec = patch["spec"]
        llamacpp = spec.get("engine", {}).get("llamacpp", {})
        kinds.update(spec)
        kinds.update(f"engine.llamacpp.{k}" for k in llamacpp)
        if "kvCacheType" in llamacpp:
            assert flag(argv, "--cache-type-k") == flag(argv, "--cache-type-v") \
                == llamacpp["kvCacheType"]
            assert flag(argv, "--flash-attn") == "on"
        if llamacpp.get("acceleratorLayers"):
            layers = llamacpp["acceleratorLayers"]
            assert flag(argv, "--n-gpu-layers") == str(layers)
            assert plan["llamacpp"]["nGpuLayers"] == layers
            # the CPU-resident layers' weights are planned host memory the pod requests
            moved = before["memory"]["weightsBytes"] * (units - layers) // units
            grown = (plan["resources"]["memoryRequestBytes"]
                     - before["resources"]["memoryRequestBytes"])
            assert grown >= moved, (grown, moved)
        if "concurrency" in spec:
            assert flag(argv, "--parallel") == str(spec["concurrency"])
        if "contextLength" in spec:
            assert plan["contextLength"] == spec["contextLength"]
        if "modelVersion" in spec:
            assert plan["quantization"] == "Q8_0" and plan["modelVersion"] == "glm4-9b-q8"
        if "accelerator" in spec:
            for key, value in spec["accelerator"].items():
                assert plan["accelerator" if key == "profile" else key] == value
    assert {"engine.llamacpp.kvCacheType", "engine.llamacpp.acceleratorLayers", "concurrency",
            "contextLength", "modelVersion", "accelerator"} <= kinds, kinds


def test_long_context_pool_advice_applied_as_printed(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    # The main pool fits; the long-context pool (12 x 32k on one A10) does not. Its patches
    # change the pool's own fields (longContext.concurrency, .contextLength, .accelerator) or
    # the service-wide engine settings, and each must turn the whole service feasible.
    mv = model_version("glm4-9b-q4", "gguf", "Q4_K_M", GLM4_9B_FACTS, "8Gi")
    fetched(kubectl, namespace, mv, 6_170_000_000, wait_for)
    base = service("lc", modelVersion="glm4-9b-q4", engine={"llamacpp": {}},
                   accelerator={"profile": "nvidia-a10"}, contextLength=8192, concurrency=2,
                   longContext={"contextLength": 32768, "concurrency": 12})
    kubectl.apply(base, namespace=namespace)
    commands = proposed_patches(kubectl, namespace, "lc", wait_for)
    assert "long-context pool does not fit" in planned(
        kubectl, namespace, "lc", "False", wait_for)["message"]
    results = apply_each_patch(kubectl, namespace, base, len(commands), wait_for,
                               pool="long-context")
    kinds = set()
    for patch, _, argv in results:
        spec = patch["spec"]
        assert "contextLength" not in spec and "concurrency" not in spec, patch  # main's own
        llamacpp = spec.get("engine", {}).get("llamacpp", {})
        kinds.update(spec)
        kinds.update(f"longContext.{k}" for k in spec.get("longContext", {}))
        kinds.update(f"engine.llamacpp.{k}" for k in llamacpp)
        pool = spec.get("longContext", {})
        if "concurrency" in pool:
            assert flag(argv, "--parallel") == str(pool["concurrency"])
        if "kvCacheType" in llamacpp:
            assert flag(argv, "--cache-type-v") == llamacpp["kvCacheType"]
    assert {"longContext.concurrency", "longContext.contextLength",
            "longContext.accelerator", "engine.llamacpp.kvCacheType"} <= kinds, kinds


def test_vllm_advice_applied_as_printed(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    # GLM-4-32B bf16 on one A100 80GB with 16 x 16k contexts: short by about 7 GiB; vLLM's
    # CPU weight offload (--cpu-offload-gb) is one of the ways out.
    mv = model_version("glm4-32b-bf16", "safetensors", "bf16", GLM4_32B_FACTS, "70Gi")
    fetched(kubectl, namespace, mv, 65_133_600_000, wait_for)
    base = service("vadvice", modelVersion="glm4-32b-bf16", engine={"vllm": {}},
                   accelerator={"profile": "nvidia-a100-80gb"}, contextLength=16384,
                   concurrency=16)
    kubectl.apply(base, namespace=namespace)
    commands = proposed_patches(kubectl, namespace, "vadvice", wait_for)
    results = apply_each_patch(kubectl, namespace, base, len(commands), wait_for)
    def offload(patch: dict[str, Any]) -> int | None:
        gib: int | None = patch["spec"].get("engine", {}).get("vllm", {}).get("cpuOffloadGiB")
        return gib

    offloads = [(patch, plan, argv) for patch, plan, argv in results if offload(patch)]
    assert offloads, [r[0] for r in results]
    for patch, plan, argv in offloads:
        gib = offload(patch)
        assert flag(argv, "--cpu-offload-gb") == str(gib)
        assert plan["vllm"]["cpuOffloadGb"] == gib
        # the pinned host copy is requested: 4 GiB + 2 GiB per GPU + the offloaded weights
        assert plan["resources"]["memoryRequestBytes"] == (6 + gib) * 2**30
    for patch, _, argv in results:
        if not offload(patch):
            assert "--cpu-offload-gb" not in argv


@pytest.mark.llama
def test_the_fields_argv_runs_on_the_pinned_llama_server(
        llama_binary: Path, tmp_path: Path) -> None:
    """engine.llamacpp's kvCacheType, kvUnified, loadMode and acceleratorLayers, planned for
    an A10 and rendered, started on the pinned llama-server (CPU build: -ngl has no device
    to fill, every other setting applies): it takes every flag, serves a chat, and its load
    log shows the KV types and the unified cache asked for."""
    spec = TinyLlamaSpec(n_ctx_train=4096, n_layer=4, n_embd=256, n_head=4, n_head_kv=2,
                         n_ff=512, dtype="f16", name="advice-argv")
    model = write_tiny_llama(tmp_path / "advice.gguf", spec)
    facts = facts_of(model)
    mv = ModelVersion.model_validate({
        "metadata": {"name": "tiny", "namespace": "ns"},
        "spec": {"source": {"uri": "hf://org/tiny/advice.gguf?revision=main"}, "format": "gguf",
                 "quantization": "F16", "cache": {"size": "1Gi"},
                 "facts": {"architecture": facts.architecture, "blockCount": facts.block_count,
                           "embeddingLength": facts.embedding_length,
                           "headCount": facts.head_count, "headCountKv": facts.head_count_kv,
                           "contextLength": facts.context_length,
                           "sizeBytes": model.stat().st_size}},
    })
    svc = GLMService.model_validate(service(
        "tiny", modelVersion="tiny", accelerator={"profile": "nvidia-a10"},
        contextLength=1024, concurrency=2,
        engine={"llamacpp": {"kvCacheType": "q4_0", "kvUnified": True, "loadMode": "no-mmap",
                             "acceleratorLayers": 3}}))
    svc.metadata.namespace = "ns"
    p = make_plan(plan_request_for(svc, mv))
    assert p.feasible, p.reason
    port = free_port()
    argv = rendered_argv(p, model, port, "tiny")
    assert flag(argv, "--cache-type-k") == flag(argv, "--cache-type-v") == "q4_0"
    assert (flag(argv, "--flash-attn"), flag(argv, "--n-gpu-layers")) == ("on", "3")
    assert flag(argv, "--load-mode") == "none" and "--kv-unified" in argv
    with start_rendered(argv, port, llama_binary, tmp_path) as server:
        status, body = http_json(server.url + "/v1/chat/completions", {
            "model": "tiny", "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 2, "temperature": 0}, timeout=120)
        assert status == 200, body
        report = LoadReport.parse(server.log_text())
    assert (report.type_k, report.type_v) == ("q4_0", "q4_0")
    assert report.context["kv_unified"] == "true"
    assert report.context["flash_attn"] == "enabled"
    assert report.kv_streams == 1


def test_the_fields_vllm_argv_is_what_the_pinned_vllm_reads() -> None:
    """engine.vllm's kvCacheType fp8 and cpuOffloadGiB, planned for an H200 and rendered, read by
    the pinned vLLM's own command line into the engine's arguments."""
    try:
        python = ensure_vllm()
    except VllmEnvError as exc:
        message = f"vllm=={VLLM_VERSION} could not be installed: {exc}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    mv = ModelVersion.model_validate({
        "metadata": {"name": "glm4-32b-bf16", "namespace": "ns"},
        **{k: v for k, v in model_version("glm4-32b-bf16", "safetensors", "bf16",
                                           GLM4_32B_FACTS, "70Gi").items() if k == "spec"}})
    cases = {}
    for name, vllm in (("fp8-offload", {"kvCacheType": "fp8", "cpuOffloadGiB": 6}),
                       ("auto-no-offload", {"kvCacheType": "auto"})):
        svc = GLMService.model_validate(service(
            name, modelVersion="glm4-32b-bf16", engine={"vllm": vllm},
            accelerator={"profile": "nvidia-h200"}))
        p = make_plan(plan_request_for(svc, mv))
        assert p.feasible, p.reason
        cases[name] = engine_argv(p, "/models/glm4-32b", 8000, name)
    parsed = parse_with_vllm(python, cases)
    assert parsed["vllm"] == VLLM_VERSION
    for name in cases:
        assert parsed["results"][name]["ok"], parsed["results"][name]["error"]
    offloaded = parsed["results"]["fp8-offload"]["engine_args"]
    assert (offloaded["kv_cache_dtype"], offloaded["cpu_offload_gb"]) == ("fp8", 6)
    plain = parsed["results"]["auto-no-offload"]["engine_args"]
    assert (plain["kv_cache_dtype"], plain["cpu_offload_gb"]) == ("auto", 0)
