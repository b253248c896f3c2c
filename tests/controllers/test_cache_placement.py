"""ReadWriteOnce caches: every pod of the version pinned to one node, and what cannot sit
there refused before rendering (decide/cache_placement.py, render/pod.py cache_affinity)."""

from __future__ import annotations

import copy
from typing import Any

import yaml
from test_service_state import EXAMPLES, cond, decide, deployments, ready_mv

HOSTNAME = "kubernetes.io/hostname"


def _a10(access_mode: str = "ReadWriteOnce", **spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    mv = yaml.safe_load((EXAMPLES / "nvidia-a10-llamacpp" / "modelversion.yaml").read_text())
    svc = yaml.safe_load((EXAMPLES / "nvidia-a10-llamacpp" / "glmservice.yaml").read_text())
    for obj, uid in ((mv, "mv-uid"), (svc, "svc-uid")):
        obj["metadata"].update(namespace="ns", uid=uid, generation=1, resourceVersion="1")
    mv["spec"]["cache"]["accessMode"] = access_mode
    svc["spec"].update(spec)
    svc["spec"].pop("autoscaling", None)
    return ready_mv(mv), svc


def _pod_affinity(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    affinity = deployment["spec"]["template"]["spec"].get("affinity", {})
    terms: list[dict[str, Any]] = affinity.get("podAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution", [])
    return terms


def test_rwo_pins_every_replica_to_the_node_of_the_versions_pods() -> None:
    mv, svc = _a10(replicas=2)
    decision = decide(svc, [mv])
    (deployment,) = deployments(decision.desired)
    version = mv["metadata"]["name"]
    assert _pod_affinity(deployment) == [{
        "labelSelector": {"matchLabels": {"glm-operator.dev/version": version}},
        "topologyKey": HOSTNAME}]
    # the pods carry the label they select, so the first one may go anywhere (it matches
    # its own term) and the rest follow it
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["glm-operator.dev/version"] == version
    # the node affinity on the GPU model stays beside it
    assert "nodeAffinity" in deployment["spec"]["template"]["spec"]["affinity"]
    assert cond(decision, "Planned").status == "True"


def test_a_shared_cache_pins_nothing() -> None:
    for mode in ("ReadWriteMany", "ReadOnlyMany"):
        mv, svc = _a10(mode, replicas=2)
        (deployment,) = deployments(decide(svc, [mv]).desired)
        assert _pod_affinity(deployment) == []


def test_the_users_affinity_keeps_the_pin() -> None:
    mv, svc = _a10(replicas=2)
    own = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "podAffinityTerm": {"topologyKey": "topology.kubernetes.io/zone",
                                          "labelSelector": {"matchLabels": {"a": "b"}}}}]}}
    svc["spec"]["podOverrides"] = {"affinity": copy.deepcopy(own)}
    (deployment,) = deployments(decide(svc, [mv]).desired)
    affinity = deployment["spec"]["template"]["spec"]["affinity"]
    assert affinity["podAntiAffinity"] == own["podAntiAffinity"]
    assert [t["topologyKey"] for t in _pod_affinity(deployment)] == [HOSTNAME]


def test_more_devices_than_one_node_has_are_refused_with_the_numbers() -> None:
    mv, svc = _a10(replicas=5)  # nvidia-a10 nodes hold 4
    decision = decide(svc, [mv])
    assert deployments(decision.desired) == []
    planned = cond(decision, "Planned")
    assert (planned.status, planned.reason) == ("False", "CacheNotShareable")
    assert "5 replicas x 1 nvidia.com/gpu = 5 nvidia.com/gpu on one node" in planned.message
    assert "a nvidia-a10 node has 4 (at most 4 replicas fit)" in planned.message
    assert "ReadWriteMany" in planned.message
    # autoscaling counts at its upper bound
    mv, svc = _a10()
    svc["spec"].pop("replicas", None)
    svc["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 6,
                                  "targets": {"queueLength": 2}}
    planned = cond(decide(svc, [mv]), "Planned")
    assert planned.reason == "CacheNotShareable"
    assert "autoscaling.maxReplicas 6 x 1" in planned.message
    # as many as fit are fine
    mv, svc = _a10(replicas=4)
    assert cond(decide(svc, [mv]), "Planned").status == "True"


def test_a_multi_node_group_with_a_rwo_cache_is_refused_before_any_pod() -> None:
    mv, svc = _a10(replicas=1, accelerator={"profile": "nvidia-a10", "count": 4, "nodes": 2})
    decision = decide(svc, [mv])
    planned = cond(decision, "Planned")
    assert (planned.status, planned.reason) == ("False", "CacheNotShareable"), planned
    assert "spans 2 nodes" in planned.message
    assert not [o for o in decision.desired
                if o["kind"] in ("Deployment", "StatefulSet", "LeaderWorkerSet")]
    mv, svc = _a10("ReadWriteMany", replicas=1,
                   accelerator={"profile": "nvidia-a10", "count": 4, "nodes": 2})
    decision = decide(svc, [mv])
    assert cond(decision, "Planned").status == "True"
    assert [o for o in decision.desired if o["kind"] == "StatefulSet"]


def _strategy(deployment: dict[str, Any]) -> dict[str, Any]:
    update: dict[str, Any] = deployment["spec"]["strategy"]["rollingUpdate"]
    return update


def test_a_pinned_pool_surges_only_where_the_node_has_room() -> None:
    # 3 of the a10 node's 4 GPUs: a surge pod fits beside them
    mv, svc = _a10(replicas=3)
    (deployment,) = deployments(decide(svc, [mv]).desired)
    assert _strategy(deployment) == {"maxSurge": 1, "maxUnavailable": 0}
    # 4 of 4: a surge pod would wait forever on the pinned node; replaced one at a time
    mv, svc = _a10(replicas=4)
    (deployment,) = deployments(decide(svc, [mv]).desired)
    assert _strategy(deployment) == {"maxSurge": 0, "maxUnavailable": 1}
    # a shared cache is not pinned: the usual surge, whatever the count
    mv, svc = _a10("ReadWriteMany", replicas=4)
    (deployment,) = deployments(decide(svc, [mv]).desired)
    assert _strategy(deployment) == {"maxSurge": 1, "maxUnavailable": 0}
