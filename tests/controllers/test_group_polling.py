"""LeaderWorkerSets are an optional CRD and not watched: a multi-node service's reconcile
reads them, and comes back while their groups settle."""

from __future__ import annotations

from typing import Any

from glm_operator.controllers.reconcile_service import _groups_settling, _multi_node

NAME = "chat-glm46"


def want(replicas: int | None = None) -> dict[str, Any]:
    spec = {} if replicas is None else {"replicas": replicas}
    return {"kind": "LeaderWorkerSet", "metadata": {"name": NAME}, "spec": spec}


def live(size: int, **status: int) -> dict[str, Any]:
    return {"kind": "LeaderWorkerSet", "metadata": {"name": NAME},
            "spec": {"replicas": size}, "status": status}


def settled(n: int) -> dict[str, int]:
    return {"replicas": n, "updatedReplicas": n, "readyReplicas": n}


def test_groups_settle_until_every_wanted_group_is_updated_and_ready() -> None:
    assert not _groups_settling([], [])
    assert _groups_settling([], [want(1)])  # created by this reconcile
    assert _groups_settling([live(2)], [want(2)])  # no status yet
    assert _groups_settling([live(2, replicas=2, updatedReplicas=2, readyReplicas=1)], [want(2)])
    assert _groups_settling([live(2, replicas=2, updatedReplicas=1, readyReplicas=2)], [want(2)])
    assert not _groups_settling([live(2, **settled(2))], [want(2)])


def test_a_scale_this_reconcile_applied_is_waited_for() -> None:
    """The live set was read before the apply: one settled group is not the two wanted."""
    assert _groups_settling([live(1, **settled(1))], [want(2)])


def test_an_autoscaled_set_is_judged_by_its_live_size() -> None:
    assert _groups_settling([live(3, **settled(2))], [want()])
    assert not _groups_settling([live(3, **settled(3))], [want()])


def test_only_multi_node_services_read_leader_worker_sets() -> None:
    assert _multi_node({"spec": {"accelerator": {"count": 8, "nodes": 2}}})
    assert not _multi_node({"spec": {"accelerator": {"count": 8}}})
    assert not _multi_node({"spec": {}})
