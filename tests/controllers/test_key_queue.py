"""KeyQueue: one run per key at a time; events behind a waiting run collapse into it."""

from __future__ import annotations

import threading
import time

import pytest
from glm_operator.controllers.key_queue import KeyQueue


def _wait_until(condition, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.001)


def _blocked_run(queue: KeyQueue, key: str, release: threading.Event,
                 started: threading.Event) -> threading.Thread:
    def work() -> None:
        started.set()
        release.wait(5)

    thread = threading.Thread(target=queue.run, args=(key, work))
    thread.start()
    assert started.wait(5)
    return thread


def test_events_behind_a_waiting_run_collapse_into_it() -> None:
    queue = KeyQueue()
    release, started = threading.Event(), threading.Event()
    first = _blocked_run(queue, "a", release, started)
    runs: list[str] = []
    results: list[bool] = []
    # The first event behind the running one waits (it may have read older state)...
    waiter = threading.Thread(target=lambda: results.append(
        queue.run("a", lambda: runs.append("waiter"), coalesce=True)))
    waiter.start()
    _wait_until(lambda: queue._entries["a"].waiting == 1)
    # ...the next ones find it waiting and are folded into it.
    for _ in range(5):
        assert queue.run("a", lambda: runs.append("extra"), coalesce=True) is False
    # Another key is not held up.
    assert queue.run("b", lambda: runs.append("b"), coalesce=True) is True
    release.set()
    first.join(5)
    waiter.join(5)
    assert runs == ["b", "waiter"]
    assert results == [True]
    assert len(queue) == 0  # nothing kept once a key is idle


def test_own_changes_never_collapse() -> None:
    queue = KeyQueue()
    release, started = threading.Event(), threading.Event()
    first = _blocked_run(queue, "a", release, started)
    runs: list[int] = []
    threads = [threading.Thread(target=queue.run, args=("a", lambda i=i: runs.append(i)))
               for i in range(3)]
    for thread in threads:
        thread.start()
    _wait_until(lambda: queue._entries["a"].waiting == 3)
    release.set()
    for thread in [first, *threads]:
        thread.join(5)
    assert sorted(runs) == [0, 1, 2]


def test_runs_of_one_key_never_overlap_and_a_failure_frees_the_key() -> None:
    queue = KeyQueue()
    inside = 0
    most = 0
    guard = threading.Lock()

    def work() -> None:
        nonlocal inside, most
        with guard:
            inside += 1
            most = max(most, inside)
        time.sleep(0.002)
        with guard:
            inside -= 1

    threads = [threading.Thread(target=queue.run, args=("a", work),
                                kwargs={"coalesce": i % 2 == 0}) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert most == 1

    def boom() -> None:
        raise RuntimeError("API error")

    with pytest.raises(RuntimeError):
        queue.run("a", boom)
    assert len(queue) == 0
    assert queue.run("a", lambda: None, coalesce=True) is True
