"""The long-context pool's idle decision (pure); decide_service carrying it out is in
test_service_state.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from glm_operator.api.glmservice import Pool
from glm_operator.api.glmservice_status import PoolStatus
from glm_operator.decide.long_context import (
    ActivityReading,
    decide_idle,
    needs_reading,
)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SPEC = Pool(context_length=65536, idle_seconds=600)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def watched(last: float) -> PoolStatus:
    """The status of an awake pool whose last activity the operator recorded at `last`."""
    return PoolStatus(last_activity_time=at(last), scale_to_zero_time=at(last + 600))


def test_a_pool_seen_awake_for_the_first_time_counts_from_now() -> None:
    # The wake is activity even when its mark failed; the old mark (before the last sleep)
    # does not put it straight back to sleep.
    old = PoolStatus(last_activity_time=at(-5000))
    decision = decide_idle(SPEC, True, old, None, at(0))
    assert not decision.sleep
    assert decision.last_activity == at(0) and decision.scale_to_zero_time == at(600)
    assert decision.requeue_after == 600


def test_no_lease_read_before_the_deadline() -> None:
    assert not needs_reading(SPEC, True, watched(0), at(599))
    decision = decide_idle(SPEC, True, watched(0), None, at(300))
    assert (decision.sleep, decision.scale_to_zero_time, decision.requeue_after) == (
        False, at(600), 300)


def test_at_the_deadline_a_fresh_mark_postpones_the_sleep() -> None:
    assert needs_reading(SPEC, True, watched(0), at(600))
    decision = decide_idle(SPEC, True, watched(0), ActivityReading(at(450)), at(600))
    assert not decision.sleep
    assert decision.last_activity == at(450)
    assert decision.scale_to_zero_time == at(1050) and decision.requeue_after == 450


@pytest.mark.parametrize("renewed", [None, -100.0, 0.0])
def test_an_old_or_missing_mark_at_the_deadline_sleeps(renewed: float | None) -> None:
    reading = ActivityReading(at(renewed) if renewed is not None else None)
    decision = decide_idle(SPEC, True, watched(0), reading, at(600))
    assert decision.sleep
    assert decision.last_activity == at(0)  # the later of the mark and the recorded wake
    assert decision.scale_to_zero_time is None and decision.requeue_after is None


def test_a_request_in_flight_keeps_the_mark_fresh() -> None:
    # A request longer than idleSeconds: its gateway renews every idleSeconds / 4.
    decision = decide_idle(SPEC, True, watched(0), ActivityReading(at(750)), at(900))
    assert not decision.sleep and decision.scale_to_zero_time == at(1350)


def test_after_an_operator_restart_the_status_and_the_lease_decide() -> None:
    # Nothing in memory: the recorded deadline has passed while the operator was down.
    status = watched(0)
    assert needs_reading(SPEC, True, status, at(4000))
    assert decide_idle(SPEC, True, status, ActivityReading(at(100)), at(4000)).sleep


def test_a_shorter_idle_seconds_moves_the_deadline_and_asks_for_a_read() -> None:
    spec = SPEC.model_copy(update={"idle_seconds": 60})
    status = watched(0)  # recorded with 600 s
    assert needs_reading(spec, True, status, at(100))
    decision = decide_idle(spec, True, status, None, at(100))
    assert not decision.sleep and decision.requeue_after == 0.0


@pytest.mark.parametrize(("spec", "awake"), [
    (SPEC, False),  # asleep already
    (SPEC.model_copy(update={"replicas": 1}), True),  # kept up by its replicas
    (None, True),
])
def test_nothing_to_do_when_asleep_or_kept_up(spec: Pool | None, awake: bool) -> None:
    assert not needs_reading(spec, awake, watched(0), at(5000))
    decision = decide_idle(spec, awake, watched(0), None, at(5000))
    assert not decision.sleep
    assert decision.scale_to_zero_time is None and decision.requeue_after is None
    assert decision.last_activity == at(0)  # what was seen last stays in the status


def test_a_scale_to_zero_counts_before_the_watch_shows_it() -> None:
    from glm_operator.controllers.own_writes import OwnWrites

    writes = OwnWrites()
    writes.scaled_to_zero[("ns", "chat-v1-lc")] = "7"
    stale = {"kind": "Deployment", "metadata": {"name": "chat-v1-lc", "resourceVersion": "7"},
             "spec": {"replicas": 2}}
    (seen,) = writes.with_own_scales("ns", [stale])
    assert seen["spec"]["replicas"] == 0 and stale["spec"]["replicas"] == 2
    woken = {**stale, "metadata": {**stale["metadata"], "resourceVersion": "9"},
             "spec": {"replicas": 1}}  # the watch caught up (and a gateway woke it since)
    (seen,) = writes.with_own_scales("ns", [woken])
    assert seen["spec"]["replicas"] == 1
    assert ("ns", "chat-v1-lc") not in writes.scaled_to_zero
