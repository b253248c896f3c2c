"""The rollout state machine (pure): canary steps, analysis verdicts, rollback, deadlines."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from glm_operator.api import AnalysisResult, Rollout, RolloutStatus
from glm_operator.decide.rollout import (
    NewVersion,
    RolloutDecision,
    RolloutInputs,
    advance,
    analysis_window,
    size_for_weight,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
CANARY = Rollout.model_validate({"strategy": "canary", "steps": [10, 50], "interval": "1m",
                                 "analysis": {"failureThreshold": 2, "minRequestCount": 5}})


def inputs(previous: RolloutStatus | None, seconds: float = 0, ready: int = 4,
           policy: Rollout = CANARY, **kw: object) -> RolloutInputs:
    base = RolloutInputs(policy=policy, stable="v1", target="v2",
                         new=NewVersion(servable=True, problem=None, ready_replicas=ready,
                                        load_seconds=60),
                         full_size=4, now=T0 + timedelta(seconds=seconds), previous=previous)
    return replace(base, **kw)  # type: ignore[arg-type]


def verdict(kind: str) -> AnalysisResult:
    return AnalysisResult(time=T0, verdict=kind, message=kind)  # type: ignore[arg-type]


def test_canary_sizes_follow_the_weight_never_a_full_stack_early() -> None:
    assert size_for_weight(4, 10) == 1
    assert size_for_weight(4, 50) == 2
    assert size_for_weight(10, 25) == 3
    assert size_for_weight(1, 1) == 1
    started = advance(inputs(None, ready=0))
    assert started.status.phase == "Progressing" and started.weight == 0
    assert started.new_replicas == 1  # sized for the first step, 10 % of 4


def test_a_healthy_canary_walks_every_step_then_promotes_after_the_drain() -> None:
    d = advance(inputs(None, ready=1))
    assert (d.status.step, d.weight, d.new_replicas) == (1, 10, 1)
    assert analysis_window(d.status, CANARY, "v1", "v2", T0 + timedelta(seconds=59)) is None
    assert analysis_window(d.status, CANARY, "v1", "v2", T0 + timedelta(seconds=61)) == 61

    d = advance(inputs(d.status, 61, ready=1, analysis=verdict("Passed")))
    # step 2 needs 2 pods before 50 % of traffic moves
    assert (d.status.step, d.weight, d.new_replicas) == (2, 10, 2)
    assert analysis_window(d.status, CANARY, "v1", "v2", T0 + timedelta(seconds=200)) is None
    d = advance(inputs(d.status, 70, ready=2))
    assert (d.status.step, d.weight) == (2, 50)
    d = advance(inputs(d.status, 131, ready=2, analysis=verdict("Passed")))
    assert d.status.phase == "Promoting" and d.new_replicas == 4 and d.weight == 50
    d = advance(inputs(d.status, 140, ready=4))
    assert d.weight == 100 and not d.promote
    d = advance(inputs(d.status, 141, ready=4))
    assert not d.promote  # draining
    d = advance(inputs(d.status, 151, ready=4))
    assert d.promote and d.status.phase == "Succeeded"
    assert d.finished is not None and d.finished.result == "Succeeded"


def _at_step_one() -> RolloutDecision:
    return advance(inputs(None, ready=1))


def test_failed_checks_roll_back_at_the_threshold() -> None:
    d = advance(inputs(_at_step_one().status, 61, ready=1, analysis=verdict("Failed")))
    assert d.status.failed_checks == 1 and d.weight == 10 and d.new_replicas == 1
    assert d.events[0][:2] == ("Warning", "AnalysisFailed")
    d = advance(inputs(d.status, 122, ready=1, analysis=verdict("Failed")))
    assert d.status.phase == "RolledBack" and d.weight == 0 and d.new_replicas is None
    assert d.events[0][:2] == ("Warning", "RolledBack")
    assert d.finished is not None and d.finished.result == "RolledBack"
    # it stays rolled back while spec.modelVersion names the same version
    again = advance(inputs(d.status, 500, ready=0))
    assert again.status.phase == "RolledBack" and again.new_replicas is None


def test_too_little_traffic_and_no_prometheus_hold_without_failing() -> None:
    for kind in ("InsufficientTraffic", "Unavailable"):
        d = advance(inputs(_at_step_one().status, 61, ready=1, analysis=verdict(kind)))
        assert d.status.step == 1 and d.weight == 10 and d.status.failed_checks == 0
        assert d.status.phase == "Progressing"
        assert d.status.step_started_time == T0 + timedelta(seconds=61)  # a fresh window


def test_paused_holds_and_resume_restarts_the_window() -> None:
    paused_policy = CANARY.model_copy(update={"paused": True})
    d = advance(inputs(_at_step_one().status, 61, ready=1, policy=paused_policy))
    assert d.status.phase == "Paused" and d.weight == 10 and d.new_replicas == 1
    assert analysis_window(d.status, paused_policy, "v1", "v2", T0 + timedelta(hours=1)) is None
    d = advance(inputs(d.status, 3600, ready=1))
    assert d.status.phase == "Progressing"
    assert d.status.step_started_time == T0 + timedelta(seconds=3600)


def test_abort_and_promote_annotations() -> None:
    d = advance(inputs(_at_step_one().status, 5, ready=1, abort_requested=True))
    assert d.status.phase == "Aborted" and d.weight == 0 and d.new_replicas is None
    d = advance(inputs(_at_step_one().status, 5, ready=1, promote_requested=True))
    assert d.status.phase == "Promoting" and d.new_replicas == 4


def test_a_version_that_never_gets_ready_fails_at_the_deadline() -> None:
    policy = CANARY.model_copy(update={"progress_deadline": "2m"})
    missing = NewVersion(servable=False, problem="ModelVersion 'v2' is Failed", ready_replicas=0,
                         load_seconds=0)
    d = advance(inputs(None, 0, policy=policy, new=missing))
    assert d.status.phase == "Progressing" and d.new_replicas is None and d.requeue_after == 120
    d = advance(inputs(d.status, 121, policy=policy, new=missing))
    assert d.status.phase == "Failed" and d.events[0][1] == "ProgressDeadlineExceeded"
    assert "ModelVersion 'v2' is Failed" in (d.status.message or "")


def test_default_deadline_is_sized_from_the_load_time() -> None:
    slow = NewVersion(servable=True, problem=None, ready_replicas=0, load_seconds=3000)
    d = advance(inputs(None, 0, new=slow))
    assert d.requeue_after == 3300  # load time + 5 min margin, above the 15 min floor


def test_surge_starts_at_full_size_and_moves_all_traffic_once_ready() -> None:
    surge = Rollout()
    d = advance(inputs(None, 0, ready=2, policy=surge))
    assert d.status.phase == "Promoting" and d.new_replicas == 4 and d.weight == 0
    d = advance(inputs(d.status, 5, ready=4, policy=surge))
    assert d.weight == 100


def test_a_canary_that_cannot_be_judged_rolls_back_at_its_undecided_deadline() -> None:
    policy = Rollout.model_validate({"strategy": "canary", "steps": [10, 50], "interval": "1m",
                                     "analysis": {"undecidedDeadline": "3m"}})
    d = advance(inputs(None, ready=1, policy=policy))
    step_started = d.status.step_started_time
    d = advance(inputs(d.status, 61, ready=1, policy=policy,
                       analysis=verdict("InsufficientTraffic")))
    assert d.status.phase == "Progressing" and d.status.undecided_since == step_started
    assert "rolls back in 119s" in (d.status.message or "")
    # Prometheus down says nothing about the canary: the clock neither stops nor restarts.
    d = advance(inputs(d.status, 122, ready=1, policy=policy, analysis=verdict("Unavailable")))
    assert d.status.phase == "Progressing" and d.status.undecided_since == step_started
    d = advance(inputs(d.status, 183, ready=1, policy=policy,
                       analysis=verdict("InsufficientTraffic")))
    assert d.status.phase == "RolledBack" and d.new_replicas is None and d.weight == 0
    assert "could not be judged for 183s (undecidedDeadline 3m)" in (d.status.message or "")
    assert "onUndecided: Wait" in (d.status.message or "")
    assert d.finished is not None and d.finished.result == "RolledBack"


def test_a_judged_check_resets_the_undecided_clock_and_wait_holds_for_ever() -> None:
    policy = Rollout.model_validate({"strategy": "canary", "steps": [10, 50], "interval": "1m",
                                     "analysis": {"undecidedDeadline": "2m",
                                                  "failureThreshold": 3}})
    d = advance(inputs(None, ready=1, policy=policy))
    d = advance(inputs(d.status, 61, ready=1, policy=policy,
                       analysis=verdict("InsufficientTraffic")))
    d = advance(inputs(d.status, 100, ready=1, policy=policy, analysis=verdict("Failed")))
    assert d.status.undecided_since is None and d.status.failed_checks == 1
    d = advance(inputs(d.status, 161, ready=1, policy=policy,
                       analysis=verdict("InsufficientTraffic")))
    assert d.status.phase == "Progressing"  # undecided for 61 s only, since the last check
    waiting = Rollout.model_validate({"strategy": "canary", "interval": "1m",
                                      "analysis": {"undecidedDeadline": "1m",
                                                   "onUndecided": "Wait"}})
    d = advance(inputs(None, ready=1, policy=waiting))
    for minute in range(1, 30):
        d = advance(inputs(d.status, 60 * minute + 1, ready=1, policy=waiting,
                           analysis=verdict("InsufficientTraffic")))
        assert d.status.phase == "Progressing" and d.weight == 10
