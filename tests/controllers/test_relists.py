"""Objects deleted while a watch was cut off: noticed at the next listing, dropped from kopf's
own indexes (the real kopf Index, whose private `_discard` the sweep relies on)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from glm_operator.controllers.relists import (
    Ghost,
    QuietRelistWatch,
    RelistDetector,
    Sweeper,
    WatchedKind,
    find_ghosts,
)
from kopf._core.engines.indexing import OperatorIndexer

DEPLOYMENTS = WatchedKind("apps/v1", "Deployment", "managed=yes", ("service_deployments",))
ACCOUNTS = WatchedKind("v1", "ServiceAccount", "managed=yes",
                       ("service_serviceaccounts", "model_serviceaccounts"))


def test_the_first_listing_is_not_a_relist_but_a_listing_of_known_objects_is() -> None:
    detector = RelistDetector()
    assert not detector.relisting("deployments", None, "a")  # kopf's first listing
    assert not detector.relisting("deployments", "ADDED", "b")  # created since
    assert not detector.relisting("deployments", "MODIFIED", "a")
    assert detector.relisting("deployments", None, "b")  # listed again
    assert detector.relisting("deployments", None, "a")
    assert not detector.relisting("services", None, "a")  # kinds are apart


def test_deleted_and_forgotten_objects_are_first_seen_again() -> None:
    detector = RelistDetector()
    detector.relisting("deployments", "ADDED", "a")
    detector.relisting("deployments", "ADDED", "b")
    detector.relisting("deployments", "DELETED", "a")
    detector.forget({"b"})
    assert not detector.relisting("deployments", None, "a")
    assert not detector.relisting("deployments", None, "b")


def test_ghosts_are_entries_the_live_list_lacks_of_kinds_that_were_listed() -> None:
    candidates = [
        ("service_deployments", ("ns", "svc"), "ns", "svc-a", "live"),
        ("service_deployments", ("ns", "svc"), "ns", "svc-b", "gone"),
        ("service_services", ("ns", "svc"), "ns", "svc", "unlisted-kind"),
    ]
    ghosts = find_ghosts(candidates, {"service_deployments": {"live"}})
    assert ghosts == [Ghost("service_deployments", ("ns", "svc"), "ns", "svc-b", "gone")]


def _entry(namespace: str, name: str, uid: str) -> bytes:
    return json.dumps({"metadata": {"namespace": namespace, "name": name, "uid": uid}}).encode()


def _identity(entry: bytes) -> tuple[str, str, str]:
    meta = json.loads(entry)["metadata"]
    return meta["namespace"], meta["name"], meta["uid"]


def _indexers(*objects: tuple[str, str, str, str, str]) -> dict[str, OperatorIndexer]:
    """(index, namespace, owner, name, uid) -> kopf indexers holding them as kopf does."""
    indexers: dict[str, OperatorIndexer] = {}
    for index, namespace, owner, name, uid in objects:
        indexer = indexers.setdefault(index, OperatorIndexer())
        indexer.replace((namespace, name, uid), {(namespace, owner): _entry(namespace, name, uid)})
    return indexers


def _names(indexer: OperatorIndexer) -> list[str]:
    return sorted(json.loads(e)["metadata"]["name"] for store in indexer.index.values()
                  for e in store)


def test_a_sweep_drops_ghosts_from_every_index_of_their_kind_and_tells_their_owners() -> None:
    indexers = _indexers(
        ("service_deployments", "ns", "svc", "svc-live", "d-live"),
        ("service_deployments", "ns", "svc", "svc-ghost", "d-ghost"),
        ("service_serviceaccounts", "ns", "svc", "svc", "sa-ghost"),
        ("model_serviceaccounts", "ns", "mv", "mv-fetch", "sa-live"),
    )
    dropped: list[list[Ghost]] = []
    live = {"Deployment": {"d-live"}, "ServiceAccount": {"sa-live"}}
    sweeper = Sweeper((DEPLOYMENTS, ACCOUNTS), lambda kind: live[kind.kind], _identity,
                      dropped.append)

    async def run() -> list[Ghost]:
        sweeper.attach(asyncio.get_running_loop(),
                       {name: indexer.index for name, indexer in indexers.items()})
        return await sweeper.sweep()

    ghosts = asyncio.run(run())
    assert sorted(g.uid for g in ghosts) == ["d-ghost", "sa-ghost"]
    assert dropped == [ghosts]
    assert _names(indexers["service_deployments"]) == ["svc-live"]
    assert _names(indexers["service_serviceaccounts"]) == []
    assert ("ns", "svc") not in indexers["service_serviceaccounts"].index  # no empty store
    assert _names(indexers["model_serviceaccounts"]) == ["mv-fetch"]


def test_a_kind_that_cannot_be_listed_keeps_its_entries() -> None:
    indexers = _indexers(("service_deployments", "ns", "svc", "svc-a", "d-a"))

    def refuse(kind: WatchedKind) -> set[str]:
        raise RuntimeError("403 forbidden")

    dropped: list[Any] = []
    sweeper = Sweeper((DEPLOYMENTS,), refuse, _identity, dropped.append)

    async def run() -> list[Ghost]:
        sweeper.attach(asyncio.get_running_loop(),
                       {name: indexer.index for name, indexer in indexers.items()})
        return await sweeper.sweep()

    assert asyncio.run(run()) == []
    assert _names(indexers["service_deployments"]) == ["svc-a"] and not dropped


def test_requests_fold_into_one_sweep() -> None:
    sweeps = 0

    def count(kind: WatchedKind) -> set[str]:
        nonlocal sweeps
        sweeps += 1
        return set()

    sweeper = Sweeper((DEPLOYMENTS,), count, _identity, lambda ghosts: None)

    async def run() -> list[bool]:
        sweeper.attach(asyncio.get_running_loop(), {})
        answers = [sweeper.request() for _ in range(5)]
        await asyncio.sleep(0.2)
        return answers

    assert asyncio.run(run()) == [True, False, False, False, False]
    assert sweeps == 1


def test_the_relist_watch_succeeding_is_not_logged_but_everything_else_is() -> None:
    import logging

    quiet = QuietRelistWatch()

    def kept(message: str) -> bool:
        return quiet.filter(logging.LogRecord("kopf.objects", logging.INFO, "", 0, message,
                                              None, None))

    assert not kept("Handler 'deployments-relists' succeeded.")
    assert kept("Handler 'deployments-changed' succeeded.")
    assert kept("Handler 'deployments-relists' failed temporarily: 404")
