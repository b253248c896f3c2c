"""PodDisruptionBudgets per pool (a voluntary eviction never takes the last ready replica,
never blocks a pool that may be empty) and topology spread of the model pods."""

from __future__ import annotations

from typing import Any

import pytest
from glm_operator.render.disruption import Budget, budget
from glm_operator.render.service import Capabilities, render_service

from render.cases import (
    GOLDEN_SPECS,
    golden_inputs,
    inputs,
    model_version,
    multi_node_inputs,
    service,
)

Obj = dict[str, Any]
POOL = "glm-operator.dev/pool"


def budgets(objects: list[Obj]) -> dict[str, Obj]:
    return {o["metadata"]["labels"][POOL]: o for o in objects
            if o["kind"] == "PodDisruptionBudget"}


def pod_labels(objects: list[Obj]) -> list[dict[str, str]]:
    out = []
    for o in objects:
        if o["kind"] in ("Deployment", "StatefulSet"):
            out.append(o["spec"]["template"]["metadata"]["labels"])
        elif o["kind"] == "LeaderWorkerSet":
            lwt = o["spec"]["leaderWorkerTemplate"]
            out += [lwt["leaderTemplate"]["metadata"]["labels"],
                    lwt["workerTemplate"]["metadata"]["labels"]]
    return out


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    """metav1.LabelSelector semantics (matchLabels and In / NotIn expressions)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        value = labels.get(e["key"])
        if e["operator"] == "In" and value not in e["values"]:
            return False
        if e["operator"] == "NotIn" and value in e["values"]:
            return False
    return True


@pytest.mark.parametrize(("min_replicas", "groups", "expected"), [
    (0, None, None),  # may be empty (replicas: 0, a sleeping long-context pool): no budget
    (1, None, Budget(min_available=1)),  # the one ready replica stays
    (2, None, Budget(max_unavailable=1)),
    (5, None, Budget(max_unavailable=1)),
    (1, 1, Budget(max_unavailable=0)),  # one group: any of its pods is the last replica
    (1, 3, Budget(max_unavailable=1)),  # an HPA runs three groups: one pod (group) at a time
    (2, 2, Budget(max_unavailable=1)),
    (0, 0, None),
])
def test_the_budget_from_min_replicas(min_replicas: int, groups: int | None,
                                      expected: Budget | None) -> None:
    assert budget(min_replicas, groups) == expected


def test_each_pool_gets_its_budget_and_a_pool_that_may_sleep_gets_none() -> None:
    svc = service("llamacpp", "a10", replicas=3,
                  longContext={"enabled": True, "contextLength": 65536})
    found = budgets(render_service(inputs(svc, model_version("gguf"))))
    assert set(found) == {"main"}  # longContext.minReplicas 0: it may have no pod at all
    main = found["main"]
    assert main["metadata"]["name"] == "chat"
    assert main["spec"]["maxUnavailable"] == 1 and "minAvailable" not in main["spec"]
    assert main["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert main["metadata"]["ownerReferences"][0]["kind"] == "GLMService"

    awake = service("llamacpp", "a10", longContext={"enabled": True, "contextLength": 65536,
                                                     "minReplicas": 1, "maxReplicas": 2})
    found = budgets(render_service(inputs(awake, model_version("gguf"))))
    assert found["main"]["spec"]["minAvailable"] == 1
    assert found["long-context"]["metadata"]["name"] == "chat-lc"
    assert found["long-context"]["spec"]["minAvailable"] == 1


def test_autoscaled_pools_are_budgeted_from_min_replicas() -> None:
    svc = service("llamacpp", "a10",
                  autoscaling={"minReplicas": 2, "maxReplicas": 6, "targets": {"queueLength": 2}})
    assert budgets(render_service(inputs(svc, model_version("gguf"))))["main"]["spec"][
        "maxUnavailable"] == 1
    none = service("llamacpp", "a10", replicas=0)
    assert budgets(render_service(inputs(none, model_version("gguf")))) == {}


@pytest.mark.parametrize("case", sorted(GOLDEN_SPECS))
def test_every_model_pod_is_selected_by_exactly_one_budget_of_its_own_pool(
        case: tuple[str, str]) -> None:
    """The eviction API refuses a pod that two budgets select: selectors never overlap."""
    engine, accelerator = case
    spec = {**GOLDEN_SPECS[case]}
    if "longContext" in spec:  # keep the pool awake so that it has a budget to test
        spec["longContext"] = {**spec["longContext"], "minReplicas": 1,
                               "maxReplicas": max(1, spec["longContext"].get("maxReplicas", 1))}
    objects = render_service(inputs(service(engine, accelerator, **spec),
                                    golden_inputs(engine, accelerator).model_version))
    found = budgets(objects)
    for labels in pod_labels(objects):
        matching = [pool for pool, b in found.items() if selects(b["spec"]["selector"], labels)]
        assert matching == [labels[POOL]], (labels, matching)


@pytest.mark.parametrize("lws", [False, True])
def test_a_groups_workers_are_in_the_main_pools_budget(lws: bool) -> None:
    objects = render_service(multi_node_inputs("llamacpp-a10x4x3",
                                               Capabilities(leader_worker_set=lws)))
    main = budgets(objects)["main"]
    assert main["spec"]["maxUnavailable"] == 1  # two groups (replicas: 2)
    labels = pod_labels(objects)
    assert any(lab.get("glm-operator.dev/group-role") == "worker" for lab in labels)
    assert all(selects(main["spec"]["selector"], lab) for lab in labels)
    one_group = render_service(multi_node_inputs("llamacpp-a10x4x3", replicas=1))
    assert budgets(one_group)["main"]["spec"]["maxUnavailable"] == 0


def test_single_node_pods_spread_over_nodes_then_zones_preferably() -> None:
    objects = render_service(golden_inputs("llamacpp", "a10"))
    pod = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]
    spread = pod["spec"]["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in spread] == ["kubernetes.io/hostname",
                                                  "topology.kubernetes.io/zone"]
    for c in spread:
        assert c["whenUnsatisfiable"] == "ScheduleAnyway" and c["maxSkew"] == 1
        assert c["matchLabelKeys"] == ["pod-template-hash"]
        assert selects(c["labelSelector"], pod["metadata"]["labels"])


def test_groups_are_not_spread_over_zones() -> None:
    for lws in (False, True):
        objects = render_service(multi_node_inputs("vllm-h100x8x2",
                                                   Capabilities(leader_worker_set=lws)))
        for o in objects:
            if o["kind"] == "StatefulSet":
                assert "topologySpreadConstraints" not in o["spec"]["template"]["spec"]
            elif o["kind"] == "LeaderWorkerSet":
                lwt = o["spec"]["leaderWorkerTemplate"]
                for template in (lwt["leaderTemplate"], lwt["workerTemplate"]):
                    assert "topologySpreadConstraints" not in template["spec"]
