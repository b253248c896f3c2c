"""Download progress: the figures, their one-line summary, and the throttle on status writes.

The clock is injected, so "at most one report every 15 s" is checked to the second; the
downloads are real files through `fetch_artifact` / `fetch_snapshot`.
"""

from __future__ import annotations

import hashlib
import itertools
from datetime import UTC, datetime
from pathlib import Path

import pytest
from gguf_files import MakeGGUF
from glm_operator.api.modelversion import ModelVersionStatus
from glm_operator.download_progress import format_duration, stopped_status_progress
from glm_operator.fetch.download import FetchOptions, fetch_artifact
from glm_operator.fetch.errors import SourceUnavailable
from glm_operator.fetch.progress import Progress, ProgressMeter, progress_summary
from glm_operator.fetch.reporter import (
    failure_status,
    fetching_status,
    progress_fields,
)
from glm_operator.fetch.sources import LocalSource

GiB, MiB = 2**30, 2**20
T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _meter(interval: float = 15.0) -> tuple[ProgressMeter, list[Progress], Clock]:
    clock, reports = Clock(), []
    return ProgressMeter(reports.append, interval, clock), reports, clock


# ---------------------------------------------------------------- the summary


def test_the_summary_reads_like_the_issue_example() -> None:
    p = Progress(done_bytes=152 * GiB + 100, total_bytes=410 * GiB, bytes_per_second=210 * MiB,
                 eta_seconds=21.5 * 60, resumed_bytes=0, elapsed_seconds=600)
    assert p.percent == 37
    assert progress_summary(p) == "Downloading 37% 152/410Gi 210MiB/s ETA 22m"


@pytest.mark.parametrize(("progress", "text"), [
    # the total not known yet (no Content-Length): bytes and rate, no percentage, no ETA
    (Progress(3 * GiB, None, 50 * MiB, None, 0, 60), "Downloading 3.0Gi 50MiB/s"),
    # the first report, before a second of samples: no rate to speak of
    (Progress(0, 2 * MiB, None, None, 0, 0), "Downloading 0% 0.0/2.0Mi"),
    # a file under a KiB, the last byte not there yet: never 100% before the end
    (Progress(999, 1000, 10.0, 0.1, 0, 3), "Downloading 99% 999/1000 10B/s ETA 1s"),
    (Progress(410 * GiB, 410 * GiB, 210 * MiB, 0, 152 * GiB, 3 * 3600 + 60, finished=True),
     "Downloaded 410Gi in 3h01m (resumed at 152Gi)"),
])
def test_summaries(progress: Progress, text: str) -> None:
    assert progress_summary(progress) == text


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (44.2, "45s"), (60, "1m"), (61, "2m"), (3599, "1h00m"), (3 * 3600 + 300, "3h05m"),
    (2 * 86400 + 4 * 3600, "2d04h"),
])
def test_durations_round_up(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


# ---------------------------------------------------------------- the throttle


def test_reports_at_most_every_interval_and_the_first_when_headers_give_the_total() -> None:
    meter, reports, clock = _meter(15)
    meter.advance(0)
    assert reports == []  # nothing to say before the response headers
    meter.started("m.gguf.partial", total=100 * MiB, present=0)
    assert len(reports) == 1 and reports[0].total_bytes == 100 * MiB
    # a chunk every 0.125 s for 60 s: 480 chunks, but a report only every 15 s
    for _ in range(480):
        clock.now += 0.125
        meter.advance(MiB // 6)
    times = [r.elapsed_seconds for r in reports]
    assert len(reports) == 5, times  # at 0, 15, 30, 45, 60
    assert all(b - a >= 15 - 1e-9 for a, b in itertools.pairwise(times))
    last = reports[-1]
    assert last.done_bytes == 480 * (MiB // 6)
    assert last.bytes_per_second == pytest.approx(MiB // 6 * 8, rel=0.05)
    assert last.eta_seconds == pytest.approx(
        (100 * MiB - last.done_bytes) / last.bytes_per_second)
    final = meter.final()
    assert final is not None and final.finished
    meter.advance(1)
    clock.now += 100
    meter.advance(1)
    assert len(reports) == 5  # the final figures go with the result, not as one more write


def test_total_unknown_until_the_headers() -> None:
    meter, reports, clock = _meter(15)
    meter.started("m.partial", total=None, present=0)  # no Content-Length
    assert reports == []  # the first report waits for a total, but not forever:
    clock.now += 15
    meter.advance(5 * MiB)
    assert len(reports) == 1
    assert reports[0].total_bytes is None and reports[0].percent is None
    assert reports[0].summary.startswith("Downloading 5.0Mi ")


def test_a_resumed_download_counts_what_is_on_disk_as_done_not_as_rate() -> None:
    meter, reports, clock = _meter(15)
    meter.started("m.partial", total=400 * GiB, present=100 * GiB)
    first = reports[0]
    assert (first.done_bytes, first.resumed_bytes, first.percent) == (100 * GiB, 100 * GiB, 25)
    assert first.bytes_per_second is None  # the 100 GiB were not moved in no time
    for _ in range(20):
        clock.now += 1
        meter.advance(100 * MiB)
    last = reports[-1]
    assert last.done_bytes == 100 * GiB + 15 * 100 * MiB
    assert last.bytes_per_second == pytest.approx(100 * MiB)
    # a server that ignores Range makes the file start over: nothing counts as resumed
    meter.started("m.partial", total=400 * GiB, present=0)
    assert meter.snapshot().resumed_bytes == 0 and meter.done == 0


def test_the_rate_follows_the_last_thirty_seconds() -> None:
    meter, _, clock = _meter(15)
    meter.started("f", total=10 * GiB, present=0)
    for _ in range(60):  # a minute at 100 MiB/s
        clock.now += 1
        meter.advance(100 * MiB)
    for _ in range(60):  # then a minute at 10 MiB/s
        clock.now += 1
        meter.advance(10 * MiB)
    rate = meter.snapshot().bytes_per_second
    assert rate is not None and rate == pytest.approx(10 * MiB, rel=0.1)


# ---------------------------------------------------------------- through real downloads


def _source(path: Path) -> LocalSource:
    return LocalSource(path=path, display=f"pvc://claim/{path.name}", filename=path.name)


def test_fetch_artifact_feeds_the_meter_and_a_resume_starts_at_the_partial(
        make_gguf: MakeGGUF, tmp_path: Path) -> None:
    model = make_gguf("glm4")
    data = model.read_bytes()
    dest = tmp_path / "c"
    dest.mkdir()
    (dest / "m.gguf.partial").write_bytes(data[:1000])
    meter, reports, _ = _meter(15)
    result = fetch_artifact(_source(model), dest, "m.gguf", FetchOptions(
        expected_sha256=hashlib.sha256(data).hexdigest(), meter=meter))
    assert result.resumed_from_bytes == 1000
    assert reports[0].done_bytes == 1000 and reports[0].total_bytes == len(data)
    final = meter.final()
    assert final is not None
    assert (final.done_bytes, final.total_bytes, final.resumed_bytes, final.percent) == (
        len(data), len(data), 1000, 100)


def test_a_cached_file_has_no_progress(make_gguf: MakeGGUF, tmp_path: Path) -> None:
    model = make_gguf("glm4")
    fetch_artifact(_source(model), tmp_path / "c", "m.gguf", FetchOptions())
    meter, reports, _ = _meter(15)
    assert fetch_artifact(_source(model), tmp_path / "c", "m.gguf",
                          FetchOptions(meter=meter)).from_cache
    assert reports == [] and meter.final() is None


# ---------------------------------------------------------------- into the status


def test_progress_fields_validate_and_name_every_field_for_the_merge_patch() -> None:
    p = Progress(152 * GiB, 410 * GiB, 210.4 * MiB, 1290.2, 0, 600)
    fields = progress_fields(p, T0)
    assert fields == {
        "summary": "Downloading 37% 152/410Gi 210MiB/s ETA 22m", "doneBytes": 152 * GiB,
        "totalBytes": 410 * GiB, "percent": 37, "bytesPerSecond": round(210.4 * MiB),
        "etaSeconds": 1291, "resumedBytes": 0, "updateTime": "2026-01-01T00:00:00Z"}
    status = ModelVersionStatus.model_validate({"progress": fields})
    assert status.progress is not None and status.progress.done_bytes == 152 * GiB
    # a figure that no longer applies is sent as null, which a merge patch removes
    unknown = progress_fields(Progress(5, None, None, None, 0, 0), T0)
    assert unknown["totalBytes"] is None and unknown["etaSeconds"] is None


def test_a_failed_or_restarted_fetch_stops_the_figures() -> None:
    moving = progress_fields(Progress(152 * GiB, 410 * GiB, 210 * MiB, 1290, 0, 600), T0)
    obj = {"metadata": {"generation": 1}, "status": {"phase": "Fetching", "progress": moving}}
    failed = failure_status(obj, SourceUnavailable("pvc://x: gone"), T0)
    assert failed["progress"]["summary"] == "Stopped at 37% 152/410Gi"
    assert failed["progress"]["etaSeconds"] is None
    assert failed["progress"]["bytesPerSecond"] is None
    assert failed["progress"]["doneBytes"] == 152 * GiB
    again = fetching_status(obj, "pvc://x", T0)
    assert again["progress"]["summary"] == "Resuming from 37% 152/410Gi"
    # without figures, or after a finished download, nothing is carried over
    assert fetching_status({"metadata": {}}, "pvc://x", T0)["progress"] is None
    done = progress_fields(Progress(4, 4, 1, 0, 0, 1, finished=True), T0)
    assert stopped_status_progress(done) is None
