"""The rollout from status.stableModelVersion to spec.modelVersion, one step at a time (pure).

Every reconcile calls `advance` with what it observed; the answer is the new rollout status,
how big the new version's main pool must be, the traffic weight it gets, and when to look
again. All state lives in `status.rollout`, so an operator restarted mid-rollout resumes at
the same step.

    surge:  Promoting -> (new pool full size and Ready) weight 100 -> (drain) Succeeded
    canary: Progressing, step 1..n: the canary sized to the step's weight; once Ready it
            gets the weight, and after each `interval` an analysis check:
              Passed              -> next step (after the last: Promoting, as surge)
              Failed              -> failedChecks + 1; at failureThreshold RolledBack
              InsufficientTraffic -> hold; undecided for analysis.undecidedDeadline:
                                     RolledBack (onUndecided: RollBack) or hold (Wait)
              Unavailable         -> hold (Prometheus down or not configured)
    any:    paused -> Paused (everything holds); abort annotation -> Aborted;
            the new version not Ready within the progress deadline -> Failed.

The stable pool is never touched here: it keeps its size (and its HPA) until the new version
is stable, and only then goes, after traffic left it. RolledBack, Aborted and Failed send all
traffic back to stable and drop the new pool; they hold until spec.modelVersion changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from glm_operator.api import (
    AnalysisResult,
    CanaryAnalysis,
    Rollout,
    RolloutPhase,
    RolloutRecord,
    RolloutStatus,
    UndecidedAction,
)
from glm_operator.api.base import duration_seconds
from glm_operator.api.glmservice_status import FINISHED_PHASES
from glm_operator.wellknown import ABORT_ANNOTATION, PROMOTE_ANNOTATION

Event = tuple[str, str, str]  # (type, reason, message)
P = RolloutPhase


@dataclass(frozen=True)
class NewVersion:
    """What the reconcile saw of the new version."""

    servable: bool  # ModelVersion Ready and the plan fits
    problem: str | None  # why not, for messages
    ready_replicas: int  # Ready pods of its main pool (0 while rolling its spec)
    load_seconds: float  # its planned load time, for the default progress deadline


@dataclass(frozen=True)
class RolloutInputs:
    policy: Rollout
    stable: str
    target: str
    new: NewVersion
    full_size: int  # main pool replicas the new version needs at 100 %
    now: datetime
    previous: RolloutStatus | None
    promote_requested: bool = False  # the promote annotation names the target
    abort_requested: bool = False  # the abort annotation names the target
    analysis: AnalysisResult | None = None  # a check run for this reconcile (when due)
    drain_seconds: float = 10.0
    min_deadline_seconds: float = 900.0
    deadline_margin_seconds: float = 300.0


@dataclass(frozen=True)
class RolloutDecision:
    status: RolloutStatus
    new_replicas: int | None  # None: the new version is not rendered (rolled back, ...)
    weight: int  # percent of traffic to the new version
    promote: bool = False  # stable := target now
    finished: RolloutRecord | None = None
    requeue_after: float | None = None
    events: list[Event] = field(default_factory=list)


def gates(policy: Rollout) -> CanaryAnalysis:
    return policy.analysis or CanaryAnalysis()


def size_for_weight(full_size: int, weight: int) -> int:
    """Canary replicas for a traffic weight: enough for its share, never a second full stack
    before the last step."""
    return max(1, math.ceil(full_size * weight / 100))


def progress_deadline_seconds(inputs: RolloutInputs) -> float:
    if inputs.policy.progress_deadline:
        return duration_seconds(inputs.policy.progress_deadline)
    return max(inputs.min_deadline_seconds,
               inputs.new.load_seconds + inputs.deadline_margin_seconds)


def analysis_window(status: RolloutStatus | None, policy: Rollout, stable: str | None,
                    target: str, now: datetime) -> int | None:
    """Seconds of metrics to judge when a canary check is due now, else None."""
    if (status is None or status.strategy != "canary" or status.phase != P.PROGRESSING
            or status.model_version != target or status.from_model_version != stable
            or policy.paused or status.step < 1 or status.step_started_time is None):
        return None
    steps = policy.effective_steps
    if status.step > len(steps) or status.weight != steps[status.step - 1]:
        return None  # the step's pods are not Ready yet: no traffic of the step to judge
    elapsed = (now - status.step_started_time).total_seconds()
    interval = duration_seconds(policy.interval)
    return math.floor(elapsed) if elapsed >= interval else None


def _elapsed(since: datetime | None, now: datetime) -> float:
    return (now - since).total_seconds() if since is not None else 0.0


def _record(status: RolloutStatus, result: str, now: datetime, message: str) -> RolloutRecord:
    return RolloutRecord(model_version=status.model_version,
                         from_model_version=status.from_model_version,
                         strategy=status.strategy, result=result,
                         started_time=status.started_time, finished_time=now, message=message)


def superseded(previous: RolloutStatus | None, now: datetime, why: str) -> RolloutRecord | None:
    """The record of an unfinished rollout that the spec moved away from."""
    if previous is None or previous.phase in FINISHED_PHASES:
        return None
    return _record(previous, "Superseded", now, why)


def advance(inputs: RolloutInputs) -> RolloutDecision:
    policy, now, new = inputs.policy, inputs.now, inputs.new
    status = inputs.previous
    if (status is None or status.model_version != inputs.target
            or status.from_model_version != inputs.stable):
        status = _start(inputs)
    if status.phase in FINISHED_PHASES:
        return RolloutDecision(status=status, new_replicas=None, weight=0)
    if inputs.abort_requested:
        return _end(status, P.ABORTED, now, "Warning", "Aborted",
                    f"rollout to {inputs.target} aborted by the {ABORT_ANNOTATION} "
                    f"annotation; {inputs.stable} serves all traffic")
    steps = policy.effective_steps
    if policy.paused:
        paused = status.model_copy(update={
            "phase": P.PAUSED, "message": "paused by spec.rollout.paused: weights, replicas "
            "and analysis hold"})
        return RolloutDecision(status=paused, new_replicas=_current_size(inputs, status),
                               weight=status.weight)
    if status.phase == P.PAUSED:  # resumed: the step's window starts afresh
        resumed = P.PROMOTING if (status.strategy == "surge" or status.step > len(steps)) \
            else P.PROGRESSING
        status = status.model_copy(update={"phase": resumed, "step_started_time": now,
                                           "progress_time": now, "undecided_since": None})
    if inputs.promote_requested and status.phase == P.PROGRESSING:
        status = status.model_copy(update={
            "phase": P.PROMOTING, "step": len(steps) + 1, "progress_time": now,
            "message": f"promoted by the {PROMOTE_ANNOTATION} annotation"})

    deadline = progress_deadline_seconds(inputs)
    if not new.servable:
        return _wait(inputs, status, deadline, new.problem or "waiting for the new version")
    if status.phase == P.PROMOTING:
        return _promoting(inputs, status, deadline)
    return _canary_step(inputs, status, deadline)


def _start(inputs: RolloutInputs) -> RolloutStatus:
    canary = inputs.policy.strategy == "canary"
    return RolloutStatus(
        strategy="canary" if canary else "surge", model_version=inputs.target,
        from_model_version=inputs.stable, phase=P.PROGRESSING if canary else P.PROMOTING,
        step=0, weight=0, started_time=inputs.now, progress_time=inputs.now,
        message=f"rolling out {inputs.target} ({'canary' if canary else 'surge'})",
    )


def _current_size(inputs: RolloutInputs, status: RolloutStatus) -> int:
    if status.strategy == "surge" or status.step > len(inputs.policy.effective_steps):
        return inputs.full_size
    steps = inputs.policy.effective_steps
    return size_for_weight(inputs.full_size, steps[max(status.step, 1) - 1])


def _end(status: RolloutStatus, phase: RolloutPhase, now: datetime, event_type: str,
         reason: str, message: str, **extra: object) -> RolloutDecision:
    ended = status.model_copy(update={"phase": phase, "weight": 0, "message": message,
                                      "progress_time": now, **extra})
    return RolloutDecision(status=ended, new_replicas=None, weight=0,
                           finished=_record(ended, str(phase), now, message),
                           events=[(event_type, reason, message)])


def _wait(inputs: RolloutInputs, status: RolloutStatus, deadline: float,
          why: str) -> RolloutDecision:
    """The new version is not there yet (model, plan or pods): wait, up to the deadline."""
    waited = _elapsed(status.progress_time, inputs.now)
    if waited >= deadline:
        return _end(status, P.FAILED, inputs.now, "Warning", "ProgressDeadlineExceeded",
                    f"{inputs.target} made no progress for {waited:.0f}s (deadline "
                    f"{deadline:.0f}s): {why}; {inputs.stable} serves all traffic")
    waiting = status.model_copy(update={"message": why})
    size = _current_size(inputs, status) if inputs.new.servable else None
    return RolloutDecision(status=waiting, new_replicas=size, weight=status.weight,
                           requeue_after=max(1.0, deadline - waited))


def _promoting(inputs: RolloutInputs, status: RolloutStatus, deadline: float) -> RolloutDecision:
    full, now = inputs.full_size, inputs.now
    if inputs.new.ready_replicas < full:
        return _wait(inputs, status, deadline,
                     f"{inputs.new.ready_replicas}/{full} pods of {inputs.target} ready")
    if status.weight < 100:
        moved = status.model_copy(update={
            "weight": 100, "step_started_time": now, "progress_time": now,
            "message": f"all traffic to {inputs.target}; {inputs.stable} drains for "
                       f"{inputs.drain_seconds:g}s"})
        return RolloutDecision(status=moved, new_replicas=full, weight=100,
                               requeue_after=max(inputs.drain_seconds, 0.5))
    drained = _elapsed(status.step_started_time, now)
    if drained < inputs.drain_seconds:
        return RolloutDecision(status=status, new_replicas=full, weight=100,
                               requeue_after=max(0.5, inputs.drain_seconds - drained))
    message = f"{inputs.target} is stable; {inputs.stable} is being removed"
    done = status.model_copy(update={"phase": P.SUCCEEDED, "progress_time": now,
                                     "message": message})
    return RolloutDecision(status=done, new_replicas=full, weight=100, promote=True,
                           finished=_record(done, "Succeeded", now, message),
                           events=[("Normal", "Promoted", message)])


def _canary_step(inputs: RolloutInputs, status: RolloutStatus,
                 deadline: float) -> RolloutDecision:
    policy, now, steps = inputs.policy, inputs.now, inputs.policy.effective_steps
    step = max(status.step, 1)
    weight = steps[step - 1]
    size = size_for_weight(inputs.full_size, weight)
    if status.weight != weight:  # the step's pods first, then its traffic
        if inputs.new.ready_replicas < size:
            return _wait(inputs, status.model_copy(update={"step": step}), deadline,
                         f"step {step}/{len(steps)}: {inputs.new.ready_replicas}/{size} canary "
                         f"pods ready before {weight}% of traffic moves")
        message = f"step {step}/{len(steps)}: {weight}% of traffic to {inputs.target}"
        moved = status.model_copy(update={"step": step, "weight": weight,
                                          "step_started_time": now, "progress_time": now,
                                          "undecided_since": None, "message": message})
        return RolloutDecision(status=moved, new_replicas=size, weight=weight,
                               requeue_after=duration_seconds(policy.interval),
                               events=[("Normal", "CanaryStep", message)])
    interval = duration_seconds(policy.interval)
    result = inputs.analysis
    if result is None:  # not due yet
        left = interval - _elapsed(status.step_started_time, now)
        return RolloutDecision(status=status, new_replicas=size, weight=weight,
                               requeue_after=max(0.5, left))
    checked = status.model_copy(update={"last_analysis": result, "step_started_time": now})
    if result.verdict in ("Passed", "Failed"):
        checked = checked.model_copy(update={"undecided_since": None})
    if result.verdict == "Passed":
        if step >= len(steps):
            promoting = checked.model_copy(update={
                "phase": P.PROMOTING, "step": len(steps) + 1, "progress_time": now,
                "message": f"every step passed; {inputs.target} grows to "
                           f"{inputs.full_size} replicas before it takes all traffic"})
            return _promoting(inputs, promoting, progress_deadline_seconds(inputs))
        nxt = checked.model_copy(update={"step": step + 1, "progress_time": now})
        return _canary_step(inputs, nxt, deadline)
    if result.verdict == "Failed":
        failed = checked.failed_checks + 1
        threshold = gates(policy).failure_threshold
        if failed >= threshold:
            return _end(checked, P.ROLLED_BACK, now, "Warning", "RolledBack",
                        f"rolled back to {inputs.stable} after {failed} failed checks "
                        f"(failureThreshold {threshold}): {result.message}",
                        failed_checks=failed)
        held = checked.model_copy(update={
            "failed_checks": failed,
            "message": f"check failed ({failed}/{threshold}): {result.message}"})
        return RolloutDecision(status=held, new_replicas=size, weight=weight,
                               requeue_after=interval,
                               events=[("Warning", "AnalysisFailed", str(held.message))])
    if result.verdict == "InsufficientTraffic":
        return _undecided(inputs, status, checked, result, size, weight, interval)
    held = checked.model_copy(update={"message": result.message})
    return RolloutDecision(status=held, new_replicas=size, weight=weight,
                           requeue_after=interval)


def _undecided(inputs: RolloutInputs, status: RolloutStatus, checked: RolloutStatus,
               result: AnalysisResult, size: int, weight: int, interval: float
               ) -> RolloutDecision:
    """A check that could not judge the canary (too little traffic): the step holds, and a
    canary undecided for undecidedDeadline rolls back (unless told to wait). Never promoted
    unjudged: a version nobody could try is not known to work."""
    policy = gates(inputs.policy)
    since = status.undecided_since or status.step_started_time or inputs.now
    undecided = _elapsed(since, inputs.now)
    deadline = duration_seconds(policy.undecided_deadline)
    if policy.on_undecided == UndecidedAction.ROLL_BACK and undecided >= deadline:
        return _end(checked, P.ROLLED_BACK, inputs.now, "Warning", "RolledBack",
                    f"rolled back to {inputs.stable}: the canary could not be judged for "
                    f"{undecided:.0f}s (undecidedDeadline {policy.undecided_deadline}): "
                    f"{result.message}; set rollout.analysis.onUndecided: Wait to hold "
                    "instead", undecided_since=since)
    left = f", rolls back in {max(0.0, deadline - undecided):.0f}s" \
        if policy.on_undecided == UndecidedAction.ROLL_BACK else ""
    held = checked.model_copy(update={"undecided_since": since,
                                      "message": f"{result.message} (undecided for "
                                                 f"{undecided:.0f}s{left})"})
    return RolloutDecision(status=held, new_replicas=size, weight=weight,
                           requeue_after=interval)
