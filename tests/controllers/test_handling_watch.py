"""The liveness verdict for an operator whose handlers never run (kopf's listing hold stuck)."""

from __future__ import annotations

import pytest
from glm_operator.controllers.handling_watch import (
    STUCK_AFTER_SECONDS,
    HandlingStuck,
    HandlingWatch,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


LIVE = {"metadata": {"name": "a"}}
DELETING = {"metadata": {"name": "b", "deletionTimestamp": "2026-11-30T00:00:00Z"}}


def test_objects_never_handled_fail_liveness_after_the_limit() -> None:
    clock = Clock()
    watch = HandlingWatch(clock)
    assert watch.check() == "waiting for objects"  # an empty cluster is healthy forever
    watch.indexed(LIVE)
    clock.now += STUCK_AFTER_SECONDS
    assert watch.check() == "waiting for objects"
    clock.now += 1
    with pytest.raises(HandlingStuck, match="no handler has run"):
        watch.check()


def test_one_handler_run_is_enough() -> None:
    clock = Clock()
    watch = HandlingWatch(clock)
    watch.indexed(LIVE)
    watch.handled()
    clock.now += 10 * STUCK_AFTER_SECONDS
    watch.indexed(LIVE)
    assert watch.check() == "handling" and watch.stuck_for() is None


def test_objects_being_deleted_do_not_count() -> None:
    # kopf calls no resume handler for them: waiting on one would restart a healthy operator.
    clock = Clock()
    watch = HandlingWatch(clock)
    watch.indexed(DELETING)
    clock.now += 10 * STUCK_AFTER_SECONDS
    assert watch.stuck_for() is None
    watch.indexed(LIVE)
    assert watch.stuck_for() == 0
