"""Status conditions, as the Kubernetes API conventions define them (metav1.Condition).

A condition list is keyed by `type`; `status` is only True, False or Unknown; `reason` is
CamelCase and machine-readable; `message` is for humans and carries the numbers.
`lastTransitionTime` moves only when `status` changes, so "since when is it not Ready"
stays answerable.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from enum import StrEnum

from pydantic import Field

from glm_operator.api.base import StatusModel

CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
MAX_CONDITIONS = 16


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(StatusModel):
    """One aspect of the object's state (metav1.Condition)."""

    type: str = Field(
        max_length=316, pattern=CONDITION_TYPE_PATTERN, description="CamelCase condition type."
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="metadata.generation the condition was computed from.",
        json_schema_extra={"format": "int64"},
    )
    last_transition_time: datetime = Field(
        description="When status last changed (not when the message last changed)."
    )
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=CONDITION_REASON_PATTERN,
        description="CamelCase, machine-readable reason for the status.",
    )
    message: str = Field(
        default="", max_length=32768, description="Human-readable detail, with the numbers."
    )


def condition_status(status: ConditionStatus | bool | None) -> ConditionStatus:
    """True/False as a bool, None as Unknown."""
    if status is None:
        return ConditionStatus.UNKNOWN
    if isinstance(status, bool):
        return ConditionStatus.TRUE if status else ConditionStatus.FALSE
    return status


def _now() -> datetime:
    # Kubernetes serialises times with second precision; keep the same so that an
    # unchanged condition round-trips to an identical status (no pointless writes).
    return datetime.now(UTC).replace(microsecond=0)


def get_condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    """The condition of that type, or None."""
    return next((c for c in conditions if c.type == type_), None)


def is_condition_true(conditions: Sequence[Condition], type_: str) -> bool:
    condition = get_condition(conditions, type_)
    return condition is not None and condition.status == ConditionStatus.TRUE


def set_condition(
    conditions: Sequence[Condition],
    type_: str,
    status: ConditionStatus | bool | None,
    reason: str,
    message: str = "",
    observed_generation: int | None = None,
    now: datetime | None = None,
) -> list[Condition]:
    """A new list with the condition of `type_` set; the input is not modified.

    `status` True or False, or None for Unknown: the answer cannot be known yet (a first
    visit, an input still missing), which is not the same as False.
    `lastTransitionTime` is kept when the status does not change, and set to `now`
    when it does (or when the condition is new). Order of the other conditions is kept.
    """
    status = condition_status(status)
    previous = get_condition(conditions, type_)
    if previous is not None and previous.status == status:
        transition_time = previous.last_transition_time
    else:
        transition_time = now or _now()
    updated = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        observed_generation=observed_generation,
        last_transition_time=transition_time,
    )
    result: list[Condition] = []
    replaced = False
    for condition in conditions:
        if condition.type == type_:
            result.append(updated)
            replaced = True
        else:
            result.append(condition)
    if not replaced:
        result.append(updated)
    return result


def remove_condition(conditions: Sequence[Condition], type_: str) -> list[Condition]:
    """A new list without the condition of `type_`."""
    return [c for c in conditions if c.type != type_]
