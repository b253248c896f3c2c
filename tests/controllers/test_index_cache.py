"""The operator's cache keeps of managedFields only who owns spec.replicas: the rest is 40 %
of a Deployment's bytes, and one copy of every child is held."""

from __future__ import annotations

from typing import Any

import pytest
from glm_operator.controllers.indexes import plain as _plain
from glm_operator.controllers.ownership import created_by_plain_create as _created_by_plain_create
from glm_operator.controllers.ownership import replicas_ours_alone as _replicas_ours_alone
from glm_operator.kube.client import FIELD_MANAGER

APPLY: dict[str, Any] = {"manager": FIELD_MANAGER, "operation": "Apply", "apiVersion": "apps/v1",
         "fieldsType": "FieldsV1",
         "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}},
                      "f:spec": {"f:replicas": {}, "f:template": {"f:spec": {}}}}}
STATUS: dict[str, Any] = {"manager": "kube-controller-manager", "operation": "Update",
                          "subresource": "status", "fieldsV1": {"f:status": {"f:replicas": {}}}}
HPA: dict[str, Any] = {"manager": "glm-operator-initial-replicas", "operation": "Apply",
       "fieldsV1": {"f:spec": {"f:replicas": {}}}}


def deployment(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "n", "managedFields": list(entries)},
            "spec": {"replicas": 2}, "status": {"replicas": 2}}


def test_cache_keeps_only_the_owners_of_replicas() -> None:
    cached = _plain(deployment(APPLY, STATUS))
    assert cached["metadata"]["managedFields"] == [
        {"manager": FIELD_MANAGER, "operation": "Apply",
         "fieldsV1": {"f:spec": {"f:replicas": {}}}}]
    assert cached["spec"] == {"replicas": 2} and cached["status"] == {"replicas": 2}


def test_replica_ownership_reads_the_same_from_the_cache() -> None:
    for live in (deployment(APPLY, STATUS), deployment(APPLY, HPA), deployment(STATUS)):
        assert _replicas_ours_alone(_plain(live)) == _replicas_ours_alone(live)
    assert _replicas_ours_alone(_plain(deployment(APPLY, STATUS)))
    assert not _replicas_ours_alone(_plain(deployment(APPLY, HPA)))


def test_objects_without_managed_fields_are_kept_as_they_are() -> None:
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "s"},
            "automountServiceAccountToken": False}
    assert _plain(body) == body


CREATED: dict[str, Any] = {"manager": "glm-operator-initial-replicas", "operation": "Update",
                           "fieldsV1": {"f:metadata": {"f:labels": {"f:team": {}}},
                                        "f:spec": {"f:template": {"f:spec": {}}}}}


def test_an_older_operators_create_entry_stays_visible_after_an_autoscaler_took_replicas() -> None:
    """An older operator created hands-off objects with a plain create: its `Update` entry
    owns every field it was created with. Once an HPA has taken replicas from it, the entry
    no longer owns replicas, but the reconcile must still see it to retire it."""
    scaled = deployment(APPLY, CREATED, {**STATUS, "subresource": "scale",
                                         "fieldsV1": {"f:spec": {"f:replicas": {}}}})
    cached = _plain(scaled)
    assert _created_by_plain_create(cached) and _created_by_plain_create(scaled)
    assert {"manager": "glm-operator-initial-replicas", "operation": "Update",
            "fieldsV1": {}} in cached["metadata"]["managedFields"]
    assert not _created_by_plain_create(_plain(deployment(APPLY, HPA)))


def test_the_cache_keeps_compact_json_and_hands_out_fresh_copies() -> None:
    from glm_operator.controllers.indexes import Cached
    from glm_operator.controllers.indexes import cached as _cached
    from glm_operator.controllers.indexes import namespace_objects as _namespace_objects
    from glm_operator.controllers.indexes import thaw as _thaw
    body = deployment(APPLY, STATUS)
    entry = _cached(body)
    assert isinstance(entry.json, bytes) and _thaw(entry) == _plain(body)
    meta = body["metadata"]
    assert entry[:3] == (meta.get("namespace", ""), meta["name"], meta.get("uid", ""))
    first, second = _thaw(entry), _thaw(entry)
    first["spec"]["replicas"] = 9
    assert second["spec"]["replicas"] == 2  # a reconcile may change what it was given

    def service(name: str, version: str) -> Cached:
        return _cached({"metadata": {"name": name, "namespace": "n"},
                        "spec": {"modelVersion": version}})
    index = {("n", "a"): [service("a", "glm-4")], ("n", "b"): [service("b", "glm-5")],
             ("m", "c"): [service("c", "glm-4")]}
    found = _namespace_objects(index, "n", mentioning="glm-4")  # type: ignore[arg-type]
    assert list(found) == ["a"] and found["a"]["spec"]["modelVersion"] == "glm-4"


@pytest.mark.parametrize("attempts, survives", [(100, True), (1, False)])
def test_reads_from_worker_threads_survive_kopf_changing_the_index(
        monkeypatch: pytest.MonkeyPatch, attempts: int, survives: bool) -> None:
    """Reconciles run in kopf's thread pool and read indexes that kopf's event loop changes
    meanwhile. With one attempt per copy (a plain iteration), the same reads fail: the
    control shows the test can see the race."""
    import sys
    import threading
    import time

    from glm_operator.controllers import indexes
    from kopf._core.engines.indexing import OperatorIndexer
    monkeypatch.setattr(indexes, "COPY_ATTEMPTS", attempts)
    indexer = OperatorIndexer()
    stop = threading.Event()

    def kopf_loop() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            body = {"metadata": {"namespace": "n", "name": f"svc{n % 20}", "uid": f"u{n}"},
                    "spec": {"modelVersion": "glm-4"}}
            indexer.replace(("n", f"svc{n % 20}", f"u{n}"),
                            {("n", f"svc{n % 20}"): indexes.cached(body)})
            if n > 30:
                indexer.discard(("n", f"svc{(n - 30) % 20}", f"u{n - 30}"))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=kopf_loop)
    thread.start()
    failures = 0
    try:
        # The race needs both threads on the cores at once: on a loaded machine the control
        # looks for up to 20 s (it stops at the first failure), the real case for 1 s.
        deadline = time.monotonic() + (1.0 if survives else 20.0)
        while time.monotonic() < deadline and not (failures and not survives):
            try:
                indexes.lookup(indexer.index, ("n", "svc3"))
                indexes.namespace_objects(indexer.index, "n", mentioning="glm-4")
                indexes.copied(indexer.index)
            except RuntimeError:
                failures += 1
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert (failures == 0) == survives, failures
