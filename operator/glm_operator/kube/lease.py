"""Leader election on a coordination.k8s.io/v1 Lease, the way client-go's leaderelection does it.

Several operator replicas run; exactly one reconciles. Each replica tries to take the Lease
every `retry_period`; it may take it when nobody holds it, when the holder released it, or
when the holder has not renewed it for `lease_duration` *as observed on this replica's own
clock* (the renewTime written by another machine is never compared with ours, so clock skew
between nodes does not matter, only clock rate). The holder renews every `retry_period`; when
it has not managed to renew for `renew_deadline` it has lost the Lease and must stop at once
(the caller exits the process, so the pod restarts as a follower). Because `renew_deadline`
is shorter than `lease_duration`, the old leader has stopped writing before any follower may
take over: that margin is the fencing.

Every write carries the resourceVersion it was computed from, so two replicas racing for a
free Lease cannot both win: the API server refuses the second with 409 Conflict.

The renewal runs in a thread of its own with a separate watchdog: a request that hangs (a
partitioned node) cannot delay the decision to step down past `renew_deadline`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Gauge

from glm_operator.kube.client import KubeClient, KubeError
from glm_operator.kube.pod_api import micro_time

API_VERSION = "coordination.k8s.io/v1"
KIND = "Lease"

LEADER = Gauge(
    "glm_operator_leader",
    "1 while this process holds the leader-election Lease, else 0.", ["lease"],
)

log = logging.getLogger("glm_operator.lease")

Clock = Callable[[], float]
WallClock = Callable[[], datetime]


def default_identity() -> str:
    """The pod name when running in a pod (POD_NAME from the downward API), else host_uuid."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class LeaseSettings:
    name: str
    namespace: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs retry period < renew deadline < lease duration (got "
                f"{self.retry_period}s, {self.renew_deadline}s, {self.lease_duration}s): the "
                "leader must give up before a follower may take over")


def _utcnow() -> datetime:
    return datetime.now(UTC)


class LeaderElector:
    """Takes, renews and releases one Lease for one identity."""

    def __init__(self, kube: KubeClient, settings: LeaseSettings, *,
                 clock: Clock = time.monotonic, wall_clock: WallClock = _utcnow) -> None:
        self.kube = kube
        self.settings = settings
        self._clock = clock
        self._wall_clock = wall_clock
        # What we last saw in the Lease and when (our clock): expiry is judged from this.
        self._observed_spec: dict[str, Any] | None = None
        self._observed_at = 0.0
        self._last_renewed: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lost = False

    # --- one attempt ------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        with self._lock:
            return self._last_renewed is not None and not self._lost

    def holder(self) -> str:
        """The holder as last observed ('' when free or unknown)."""
        return str((self._observed_spec or {}).get("holderIdentity") or "")

    def try_acquire_or_renew(self) -> bool:
        """One attempt to take or renew the Lease; True when this identity holds it now."""
        s = self.settings
        now = self._wall_clock()
        lease = self.kube.get(API_VERSION, KIND, s.namespace, s.name)
        if lease is None:
            try:
                created = self.kube.create({
                    "apiVersion": API_VERSION, "kind": KIND,
                    "metadata": {"name": s.name, "namespace": s.namespace},
                    "spec": self._spec(now, acquire_time=now, transitions=0),
                })
            except KubeError as exc:
                if exc.status == 409:  # another replica created it first
                    return False
                raise
            self._observe(created.get("spec") or {})
            return self._renewed()
        spec = lease.get("spec") or {}
        self._observe(spec)
        holder = spec.get("holderIdentity") or ""
        if holder and holder != s.identity and not self._expired(spec):
            return False
        mine = holder == s.identity
        transitions = int(spec.get("leaseTransitions") or 0)
        new_spec = self._spec(
            now,
            acquire_time=None if mine else now,
            transitions=transitions if mine else transitions + 1,
        )
        if mine and spec.get("acquireTime"):
            new_spec["acquireTime"] = spec["acquireTime"]
        try:
            updated = self.kube.patch_merge(
                API_VERSION, KIND, s.namespace, s.name,
                {"metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                 "spec": new_spec})
        except KubeError as exc:
            if exc.status == 409:  # someone else wrote it since we read it
                return False
            raise
        if not mine:
            log.info("took the Lease %s/%s from %r", s.namespace, s.name, holder or "nobody")
        self._observe(updated.get("spec") or {})
        return self._renewed()

    def _spec(self, now: datetime, *, acquire_time: datetime | None,
              transitions: int) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "holderIdentity": self.settings.identity,
            "leaseDurationSeconds": max(1, round(self.settings.lease_duration)),
            "renewTime": micro_time(now),
            "leaseTransitions": transitions,
        }
        if acquire_time is not None:
            spec["acquireTime"] = micro_time(acquire_time)
        return spec

    def _observe(self, spec: dict[str, Any]) -> None:
        if spec != self._observed_spec:
            self._observed_spec = dict(spec)
            self._observed_at = self._clock()

    def _expired(self, spec: dict[str, Any]) -> bool:
        duration = float(spec.get("leaseDurationSeconds") or self.settings.lease_duration)
        return self._clock() >= self._observed_at + duration

    def _renewed(self) -> bool:
        with self._lock:
            self._last_renewed = self._clock()
        LEADER.labels(self.settings.name).set(1)
        return True

    # --- loops --------------------------------------------------------------------------------

    def acquire(self, stop: threading.Event) -> bool:
        """Block until this identity holds the Lease (True) or `stop` is set (False)."""
        s = self.settings
        LEADER.labels(s.name).set(0)
        log.info("waiting to lead: Lease %s/%s as %s", s.namespace, s.name, s.identity)
        reported = ""
        while not stop.is_set():
            try:
                if self.try_acquire_or_renew():
                    log.info("leading: Lease %s/%s held by %s", s.namespace, s.name, s.identity)
                    return True
            except KubeError as exc:
                log.warning("Lease %s/%s: %s", s.namespace, s.name, exc)
            if self.holder() != reported:
                reported = self.holder()
                log.info("following: Lease %s/%s is held by %s", s.namespace, s.name, reported)
            stop.wait(s.retry_period)
        return False

    def keep_renewing(self, on_lost: Callable[[], None]) -> None:
        """Renew every retry period in a thread; call `on_lost` once the Lease is lost.

        Lost means: another identity holds it, or no renewal succeeded for renew_deadline. A
        watchdog thread checks the deadline, so a hung request cannot postpone it.
        """
        lost_once = threading.Lock()

        def lose(why: str) -> None:
            if not lost_once.acquire(blocking=False):
                return
            with self._lock:
                self._lost = True
            LEADER.labels(self.settings.name).set(0)
            log.error("lost the Lease %s/%s: %s", self.settings.namespace, self.settings.name,
                      why)
            on_lost()

        def renew() -> None:
            s = self.settings
            while not self._stop.wait(s.retry_period):
                try:
                    renewed = self.try_acquire_or_renew()
                    if not renewed and self.holder() and self.holder() != s.identity:
                        lose(f"now held by {self.holder()}")
                        return
                except KubeError as exc:
                    log.warning("renewing the Lease %s/%s failed: %s", s.namespace, s.name, exc)
                except Exception as exc:  # the watchdog decides; keep trying until then
                    log.warning("renewing the Lease %s/%s failed: %r", s.namespace, s.name, exc)

        def watchdog() -> None:
            s = self.settings
            while not self._stop.wait(min(0.5, s.retry_period / 2)):
                with self._lock:
                    last = self._last_renewed
                if last is not None and self._clock() - last > s.renew_deadline:
                    lose(f"not renewed for {s.renew_deadline:g}s")
                    return

        for target, name in ((renew, "glm-lease-renew"), (watchdog, "glm-lease-watchdog")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop renewing (the Lease then expires unless released)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.settings.retry_period + 5)
        self._threads.clear()

    def release(self) -> bool:
        """Hand the Lease back so a follower takes over at its next try, not after expiry.

        Only when this identity still holds it; guarded by resourceVersion like every write.
        """
        self.stop()
        s = self.settings
        try:
            lease = self.kube.get(API_VERSION, KIND, s.namespace, s.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != s.identity:
                return False
            now = micro_time(self._wall_clock())
            self.kube.patch_merge(
                API_VERSION, KIND, s.namespace, s.name,
                {"metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                 "spec": {"holderIdentity": None, "leaseDurationSeconds": 1,
                          "renewTime": now, "acquireTime": now}})
        except KubeError as exc:
            log.warning("releasing the Lease %s/%s failed: %s", s.namespace, s.name, exc)
            return False
        finally:
            with self._lock:
                self._last_renewed = None
            LEADER.labels(s.name).set(0)
        log.info("released the Lease %s/%s", s.namespace, s.name)
        return True
