"""What the fetch Job writes into ModelVersion status: pure functions over the current object."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from glm_operator.api.modelversion import ModelVersionStatus
from glm_operator.fetch.download import FetchResult
from glm_operator.fetch.errors import ChecksumMismatch, SourceNotFound
from glm_operator.fetch.gguf_header import GGUFFacts
from glm_operator.fetch.reporter import (
    StatusTarget,
    failure_status,
    fetching_status,
    success_status,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = datetime(2026, 1, 2, tzinfo=UTC)
OBJ = {"metadata": {"name": "mv", "generation": 3}, "spec": {"sha256": "a" * 64}}
FACTS = GGUFFacts(version=3, tensor_count=10, kv_count=20, architecture="glm4moe",
                  block_count=47, context_length=131072, embedding_length=4096, head_count=96,
                  head_count_kv=8, key_length=128, value_length=128, nextn_predict_layers=1,
                  expert_count=128, expert_used_count=8, file_type=15,
                  feed_forward_length=10944, expert_feed_forward_length=1408)
RESULT = FetchResult(Path("/cache/m.gguf"), 1234, "a" * 64, FACTS, False, 0, 1, 0.5)


def _condition(status: dict, type_: str) -> dict:  # type: ignore[type-arg]
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_success_status_validates_against_the_api_types() -> None:
    status = success_status(OBJ, RESULT, StatusTarget("ns", "mv", "mv-cache"), "m.gguf", T0)
    parsed = ModelVersionStatus.model_validate(status)
    assert parsed.phase == "Ready" and parsed.size_bytes == 1234
    assert parsed.facts is not None and parsed.facts.file_type == "Q4_K_M"
    assert parsed.facts.nextn_predict_layers == 1 and parsed.facts.block_count == 47
    assert status["cache"] == {"path": "m.gguf", "claimName": "mv-cache"}
    assert status["facts"]["headCountKv"] == 8
    assert (status["facts"]["feedForwardLength"], status["facts"]["expertFeedForwardLength"]) == (
        10944, 1408)
    assert _condition(status, "Verified")["status"] == "True"
    assert _condition(status, "Cached")["reason"] == "Downloaded"
    assert _condition(status, "Cached")["observedGeneration"] == 3


def test_transition_time_moves_only_when_status_changes() -> None:
    fetching = fetching_status(OBJ, "hf://o/r/m.gguf", T0)
    assert _condition(fetching, "Cached")["status"] == "False"
    failed = failure_status({**OBJ, "status": fetching}, SourceNotFound("404 at source"), T1)
    cached = _condition(failed, "Cached")
    assert cached["reason"] == "SourceNotFound" and cached["message"] == "404 at source"
    assert cached["lastTransitionTime"] == "2026-01-01T00:00:00Z"  # False -> False: unchanged
    assert _condition(failed, "Verified")["status"] == "Unknown"
    done = success_status({**OBJ, "status": failed}, RESULT, StatusTarget("ns", "mv"), "m", T1)
    assert _condition(done, "Cached")["lastTransitionTime"] == "2026-01-02T00:00:00Z"


def test_verification_failure_sets_verified_false() -> None:
    status = failure_status(OBJ, ChecksumMismatch("sha256 is b.., spec says a.."), T0)
    assert status["phase"] == "Failed"
    assert _condition(status, "Verified") | {"lastTransitionTime": None} == {
        "type": "Verified", "status": "False", "reason": "ChecksumMismatch",
        "message": "sha256 is b.., spec says a..", "observedGeneration": 3,
        "lastTransitionTime": None}
    ModelVersionStatus.model_validate(status)


def test_other_conditions_are_kept() -> None:
    ready = {"type": "Ready", "status": "False", "reason": "Waiting", "message": "",
             "lastTransitionTime": "2025-12-31T00:00:00Z"}
    status = success_status({**OBJ, "status": {"conditions": [ready]}}, RESULT,
                            StatusTarget("ns", "mv"), "m", T0)
    assert _condition(status, "Ready") == ready
