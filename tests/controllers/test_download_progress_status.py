"""A download's progress as the operator shows it: in a waiting GLMService's ModelReady
message, and stopped when the fetch Job dies without reporting."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from glm_operator.config import OperatorConfig
from glm_operator.decide.model_version import decide_model_version
from test_service_state import cond, decide, deployments, load

NOW = datetime(2026, 1, 1, tzinfo=UTC)
GiB = 2**30
PROGRESS = {"summary": "Downloading 37% 152/410Gi 210MiB/s ETA 22m", "doneBytes": 152 * GiB,
            "totalBytes": 410 * GiB, "percent": 37, "bytesPerSecond": 210 * 2**20,
            "etaSeconds": 1300, "resumedBytes": 0, "updateTime": "2026-01-01T00:00:00Z"}


def _fetching(mv: dict[str, Any]) -> dict[str, Any]:
    mv = copy.deepcopy(mv)
    mv["status"] = {"phase": "Fetching", "progress": dict(PROGRESS)}
    return mv


def test_a_service_waiting_on_a_download_says_how_far_it_is() -> None:
    mv, svc = load("cpu-llamacpp")
    decision = decide(svc, [_fetching(mv)])
    assert deployments(decision.desired) == []
    model = cond(decision, "ModelReady")
    assert (model.status, model.reason) == ("False", "ModelVersionNotReady")
    assert "Downloading 37% 152/410Gi 210MiB/s ETA 22m" in model.message
    assert model.message.startswith(f"ModelVersion {mv['metadata']['name']!r} is Fetching (")


def test_a_fetch_job_that_died_leaves_its_figures_stopped() -> None:
    mv, _ = load("cpu-llamacpp")
    mv = _fetching(mv)
    mv["metadata"].update(namespace="ns", uid="u", generation=1)
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x-fetch"},
           "status": {"conditions": [{"type": "Failed", "status": "True",
                                      "reason": "DeadlineExceeded",
                                      "message": "Job was active longer than specified"}]}}
    decision = decide_model_version(mv, [job], OperatorConfig(), NOW)
    patch = decision.status_patch
    assert patch["phase"] == "Failed"
    assert patch["progress"]["summary"] == "Stopped at 37% 152/410Gi"
    assert patch["progress"]["etaSeconds"] is None
    assert patch["progress"]["doneBytes"] == 152 * GiB
    # still fetching: the Job's figures are the Job's, the operator writes none of them
    running = decide_model_version(mv, [{**job, "status": {"active": 1}}], OperatorConfig(), NOW)
    assert "progress" not in running.status_patch
