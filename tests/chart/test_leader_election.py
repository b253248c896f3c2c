"""The Lease leader election the chart's replicas run under (kube/lease.py), on a fake API.

The fake keeps one Lease with a resourceVersion and refuses stale writes with 409, as the API
server does; the clocks are fake so expiry is exact. The real thing, two operator processes
on one Lease with a SIGKILL, is e2e/test_ha.py.
"""

from __future__ import annotations

import copy
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from glm_operator.kube.client import KubeError
from glm_operator.kube.lease import LeaderElector, LeaseSettings, micro_time


class FakeLeases:
    """get/create/patch_merge of Leases with optimistic concurrency, like the API server."""

    def __init__(self) -> None:
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0
        self.fail: KubeError | None = None
        self.hang = threading.Event()  # set: every request blocks until cleared
        self.writes: list[tuple[str, str]] = []

    def _guard(self) -> None:
        while self.hang.is_set():
            time.sleep(0.01)
        if self.fail is not None:
            raise self.fail

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        assert (api_version, kind) == ("coordination.k8s.io/v1", "Lease")
        self._guard()
        found = self.leases.get((namespace, name))
        return copy.deepcopy(found) if found else None

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._guard()
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        if key in self.leases:
            raise KubeError("409 already exists", status=409)
        self.version += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.leases[key] = stored
        self.writes.append(("create", obj["spec"]["holderIdentity"]))
        return copy.deepcopy(stored)

    def patch_merge(self, api_version: str, kind: str, namespace: str, name: str,
                    patch: dict[str, Any], subresource: str | None = None) -> dict[str, Any]:
        self._guard()
        current = self.leases[(namespace, name)]
        if patch["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]:
            raise KubeError("409 the object has been modified", status=409)
        for key, value in patch["spec"].items():
            if value is None:
                current["spec"].pop(key, None)
            else:
                current["spec"][key] = value
        self.version += 1
        current["metadata"]["resourceVersion"] = str(self.version)
        self.writes.append(("patch", str(current["spec"].get("holderIdentity"))))
        return copy.deepcopy(current)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(api: FakeLeases, identity: str, clock: FakeClock, **timing: float) -> LeaderElector:
    settings = LeaseSettings(name="glm-operator", namespace="ops", identity=identity, **timing)
    return LeaderElector(api, settings, clock=clock,  # type: ignore[arg-type]
                         wall_clock=lambda: datetime(2026, 1, 1, tzinfo=UTC)
                         + timedelta(seconds=clock.now))


def test_the_first_replica_creates_the_lease_and_the_second_follows() -> None:
    api, clock = FakeLeases(), FakeClock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    lease = api.leases[("ops", "glm-operator")]["spec"]
    assert lease["holderIdentity"] == "a"
    assert lease["leaseDurationSeconds"] == 15
    assert lease["leaseTransitions"] == 0
    assert b.holder() == "a"
    assert api.writes == [("create", "a")]  # the follower wrote nothing


def test_a_renewed_lease_is_never_taken_however_old_its_renew_time() -> None:
    api, clock = FakeLeases(), FakeClock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.try_acquire_or_renew()
    for _ in range(20):  # 20 x 10 s: far beyond 15 s in total, but renewed all along
        clock.now += 10
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    assert api.leases[("ops", "glm-operator")]["spec"]["holderIdentity"] == "a"


def test_an_unrenewed_lease_is_taken_after_the_duration_on_the_followers_clock() -> None:
    api, clock = FakeLeases(), FakeClock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.try_acquire_or_renew()
    first_acquire = api.leases[("ops", "glm-operator")]["spec"]["acquireTime"]
    assert not b.try_acquire_or_renew()  # b first sees the record now
    clock.now += 14.9
    assert not b.try_acquire_or_renew()
    clock.now += 0.2
    assert b.try_acquire_or_renew()
    spec = api.leases[("ops", "glm-operator")]["spec"]
    assert spec["holderIdentity"] == "b"
    assert spec["leaseTransitions"] == 1
    assert spec["acquireTime"] != first_acquire
    # the old leader's next renewal sees another holder and does not write
    writes = len(api.writes)
    assert not a.try_acquire_or_renew()
    assert a.holder() == "b" and len(api.writes) == writes


def test_a_renewal_keeps_the_acquire_time() -> None:
    api, clock = FakeLeases(), FakeClock()
    a = elector(api, "a", clock)
    assert a.try_acquire_or_renew()
    acquired = api.leases[("ops", "glm-operator")]["spec"]["acquireTime"]
    clock.now += 2
    assert a.try_acquire_or_renew()
    spec = api.leases[("ops", "glm-operator")]["spec"]
    assert spec["acquireTime"] == acquired
    assert spec["renewTime"] == micro_time(datetime(2026, 1, 1, tzinfo=UTC)
                                           + timedelta(seconds=1002))


def test_two_replicas_racing_for_a_free_lease_cannot_both_win() -> None:
    api, clock = FakeLeases(), FakeClock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.try_acquire_or_renew()
    assert a.release()
    # both read the released Lease, then both write: the second write is stale (409)
    stale = api.get("coordination.k8s.io/v1", "Lease", "ops", "glm-operator")
    original_get = api.get
    api.get = lambda *args: copy.deepcopy(stale)  # type: ignore[method-assign]
    results = [a.try_acquire_or_renew(), b.try_acquire_or_renew()]
    api.get = original_get  # type: ignore[method-assign]
    assert results == [True, False]
    assert api.leases[("ops", "glm-operator")]["spec"]["holderIdentity"] == "a"


def test_release_hands_over_at_the_next_try_without_waiting_for_expiry() -> None:
    api, clock = FakeLeases(), FakeClock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.release()
    assert "holderIdentity" not in api.leases[("ops", "glm-operator")]["spec"]
    assert b.try_acquire_or_renew()  # same instant: no waiting for the 15 s
    assert not a.release()  # no longer the holder: it must not clear b's Lease
    assert api.leases[("ops", "glm-operator")]["spec"]["holderIdentity"] == "b"


def test_settings_refuse_a_renew_deadline_that_is_not_below_the_lease_duration() -> None:
    with pytest.raises(ValueError, match="renew deadline < lease duration"):
        LeaseSettings(name="x", namespace="y", identity="z", lease_duration=10,
                      renew_deadline=10, retry_period=2)
    with pytest.raises(ValueError, match="retry period < renew deadline"):
        LeaseSettings(name="x", namespace="y", identity="z", lease_duration=15,
                      renew_deadline=2, retry_period=2)


def _wait(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_the_leader_steps_down_when_renewals_fail_for_the_deadline() -> None:
    api = FakeLeases()
    settings = LeaseSettings(name="l", namespace="ops", identity="a", lease_duration=1.5,
                             renew_deadline=0.6, retry_period=0.1)
    leader = LeaderElector(api, settings)  # type: ignore[arg-type]
    lost = threading.Event()
    assert leader.acquire(threading.Event())
    leader.keep_renewing(on_lost=lost.set)
    time.sleep(0.4)
    assert not lost.is_set() and leader.is_leader
    api.fail = KubeError("503 etcd unavailable", status=503)
    started = time.monotonic()
    assert lost.wait(3)
    # Not before the renew deadline's worth of failures, and before the lease could have
    # passed to another replica (the property that matters: never two leaders).
    assert 0.4 <= time.monotonic() - started < settings.lease_duration
    assert not leader.is_leader
    leader.stop()


def test_a_hung_renewal_does_not_postpone_stepping_down() -> None:
    api = FakeLeases()
    settings = LeaseSettings(name="l", namespace="ops", identity="a", lease_duration=1.5,
                             renew_deadline=0.6, retry_period=0.1)
    leader = LeaderElector(api, settings)  # type: ignore[arg-type]
    lost = threading.Event()
    assert leader.acquire(threading.Event())
    leader.keep_renewing(on_lost=lost.set)
    api.hang.set()  # a partitioned node: requests never answer
    started = time.monotonic()
    assert lost.wait(3)
    assert time.monotonic() - started < settings.lease_duration  # before another can lead
    api.hang.clear()
    leader.stop()


def test_the_leader_steps_down_at_once_when_someone_else_holds_the_lease() -> None:
    api = FakeLeases()
    settings = LeaseSettings(name="l", namespace="ops", identity="a", lease_duration=1.5,
                             renew_deadline=0.6, retry_period=0.1)
    leader = LeaderElector(api, settings)  # type: ignore[arg-type]
    lost = threading.Event()
    assert leader.acquire(threading.Event())
    leader.keep_renewing(on_lost=lost.set)
    api.leases[("ops", "l")]["spec"]["holderIdentity"] = "intruder"
    api.leases[("ops", "l")]["metadata"]["resourceVersion"] = "999"
    assert lost.wait(1)
    leader.stop()


def test_acquire_returns_when_stopped_while_following() -> None:
    api, clock = FakeLeases(), FakeClock()
    assert elector(api, "a", clock).try_acquire_or_renew()
    settings = LeaseSettings(name="glm-operator", namespace="ops", identity="b",
                             lease_duration=60, renew_deadline=10, retry_period=0.05)
    follower = LeaderElector(api, settings)  # type: ignore[arg-type]
    stop = threading.Event()
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(follower.acquire(stop)))
    thread.start()
    _wait(lambda: follower.holder() == "a")
    stop.set()
    thread.join(2)
    assert result == [False]
