"""GLM-5 FP8 on one node of eight H200, laid out as the field serves it, placed by the real
kube-scheduler on the kwok H200 node of e2e/nodes.yaml (issue 38).

The issue's request (16 concurrent 128k contexts) does not fit at TP8, where the MLA latent
cache is copied onto every rank: the planner then lays the same eight GPUs out with decode
context parallelism or DEP8 (data-parallel attention with expert parallelism), which keep one
node, where a TP-only planner proposed three. `spec.engine.vllm.layout` forces a layout.
Checked on the live objects: status.plan's chosen layout and every layout's capacity side by
side, one pod with eight GPUs on the H200 node, its vLLM argv, and the Layout column of
`kubectl get glms -o wide`. kwok plays the kubelet: no vLLM runs (its argv is checked by
vLLM's own CLI in e2e/test_vllm_argv.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from e2e import cluster as local_cluster
from e2e.kubectl import Kubectl
from e2e.operator_fixtures import OperatorProcess, glm_crds, operator, report_fetched
from e2e.test_operator import wait_ready

__all__ = ["glm_crds", "operator"]  # fixtures used by name

Wait = Callable[..., Any]
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "nvidia-h200-glm5-vllm"
SERVICE_LABEL = "glm-operator.dev/service"
H200_NODE = "gpu-h200-1"
SIZE_BYTES = 754_000_000_000  # the FP8 weights with the MTP layer


def example(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((EXAMPLE / f"{name}.yaml").read_text())
    return loaded


def h200_free(kubectl: Kubectl) -> bool:
    return not any(pod["spec"].get("nodeName") == H200_NODE
                   and pod.get("status", {}).get("phase") in ("Pending", "Running")
                   for pod in kubectl.items("pods", "-A"))


def fetched_glm5(kubectl: Kubectl, ns: str, wait_for: Wait) -> str:
    mv = example("modelversion")
    mv["spec"]["cache"]["size"] = "2Ti"  # the cluster's large volumes (recycled between tests)
    name: str = mv["metadata"]["name"]
    local_cluster.recycle_released_volumes(kubectl)
    kubectl.apply(mv, namespace=ns)
    wait_for(lambda: kubectl.items("jobs", "-n", ns, "-l",
                                   f"glm-operator.dev/model-version={name}"),
             timeout=60, what=f"the fetch Job of {name}")
    report_fetched(kubectl, ns, name, size=SIZE_BYTES)
    return name


def running_pod(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any] | None:
    pods = [p for p in kubectl.items("pods", "-n", ns, "-l", f"{SERVICE_LABEL}={name}")
            if not p["metadata"].get("deletionTimestamp")]
    if len(pods) == 1 and pods[0].get("status", {}).get("phase") == "Running":
        return pods[0]
    return None


def engine_args(pod: dict[str, Any]) -> list[str]:
    (engine,) = [c for c in pod["spec"]["containers"] if c["name"] == "engine"]
    args: list[str] = engine["args"]
    return args


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def serve(kubectl: Kubectl, ns: str, wait_for: Wait, name: str, **vllm: Any
          ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The example's GLMService at 16 x 128k, with `vllm` engine settings: its status and
    its one running pod."""
    svc = copy.deepcopy(example("glmservice"))
    svc["metadata"]["name"] = name
    svc["spec"].update(concurrency=16, engine={"vllm": vllm})
    kubectl.apply(svc, namespace=ns)
    obj = wait_ready(kubectl, ns, name, wait_for)
    pod = wait_for(lambda: running_pod(kubectl, ns, name), timeout=120,
                   what=f"{name}'s one pod running")
    return obj, pod


def test_glm5_at_16_x_128k_fits_one_h200_node_in_a_layout_the_planner_chooses(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    ns = namespace
    wait_for(lambda: h200_free(kubectl), timeout=120, what="the H200 node free")
    fetched_glm5(kubectl, ns, wait_for)

    obj, pod = serve(kubectl, ns, wait_for, "glm5")
    plan = obj["status"]["plan"]
    layouts = {lc["layout"]: lc for lc in plan["layouts"]}
    # TP8 copies the latent cache onto every rank: it holds fewer than the 16 asked.
    assert not layouts["tp"]["feasible"], layouts["tp"]
    chosen = plan["vllm"]["layout"]
    assert layouts["tp"]["requestsAtContext"] < 16 <= layouts[chosen]["requestsAtContext"]
    assert chosen in ("dcp", "dep") and layouts[chosen]["chosen"], plan["layouts"]
    # One node of eight GPUs, where a tensor-parallel-only plan asked for three.
    assert (plan["nodes"], plan["count"]) == (1, 8)
    assert pod["spec"]["nodeName"] == H200_NODE
    (engine,) = [c for c in pod["spec"]["containers"] if c["name"] == "engine"]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "8"
    args = engine_args(pod)
    if chosen == "dcp":
        assert flag(args, "--decode-context-parallel-size") == "8", args
    assert flag(args, "--kv-cache-dtype") == "fp8", args  # the GLM-5 recipes' KV cache

    wide = kubectl("get", "glms", "glm5", "-n", ns, "-o", "wide").stdout
    header, row = wide.splitlines()[:2]
    assert "LAYOUT" in header.split() and chosen in row.split(), wide
    kubectl("delete", "glmservice", "glm5", "-n", ns, "--wait=true")
    wait_for(lambda: h200_free(kubectl), timeout=120, what="the H200 node free again")

    # Forced DEP8: data-parallel attention, expert parallelism, a rank's share of the seqs.
    obj, pod = serve(kubectl, ns, wait_for, "glm5-dep", layout="dep")
    plan = obj["status"]["plan"]
    assert plan["vllm"]["layout"] == "dep", plan["vllm"]
    assert pod["spec"]["nodeName"] == H200_NODE
    args = engine_args(pod)
    assert flag(args, "--data-parallel-size") == "8" and "--enable-expert-parallel" in args
    assert flag(args, "--tensor-parallel-size") == "1", args
    assert flag(args, "--max-num-seqs") == "2", args  # 16 sequences over 8 ranks
    kubectl("delete", "glmservice", "glm5-dep", "-n", ns, "--wait=true")
