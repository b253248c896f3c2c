"""What a ModelVersion should look like right now: its cache children and status (pure).

The fetch Job does the work and reports what it measured (phase, sha256, size, GGUF facts,
the Verified and Cached conditions) with its own narrow ServiceAccount. The operator owns
the rest: the children (cache PVC, RBAC, Job), `Pending`/`Fetching` until the Job reports,
`Failed` when the Job gives up without reporting, and the `Ready` summary condition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from glm_operator.api import ModelVersion, ModelVersionConditionType, set_condition
from glm_operator.api.conditions import is_condition_true
from glm_operator.config import OperatorConfig
from glm_operator.download_progress import stopped_status_progress
from glm_operator.render.modelversion import render_model_version

Obj = dict[str, Any]
C = ModelVersionConditionType


@dataclass(frozen=True)
class ModelVersionDecision:
    desired: list[Obj]
    status_patch: dict[str, Any]  # the operator's fields only; {} when nothing changes
    events: list[tuple[str, str, str]]


def _job_failure(jobs: Sequence[Obj]) -> str | None:
    for job in jobs:
        for cond in job.get("status", {}).get("conditions", []):
            if cond.get("type") == "Failed" and cond.get("status") == "True":
                return (f"fetch Job {job['metadata']['name']} failed: "
                        f"{cond.get('reason', '')} {cond.get('message', '')}".strip())
    return None


def decide_model_version(
    body: Mapping[str, Any],
    live_children: Sequence[Obj],
    config: OperatorConfig,
    now: datetime | None = None,
) -> ModelVersionDecision:
    mv = ModelVersion.model_validate(body)
    desired = render_model_version(mv, config)
    status = mv.status
    generation = mv.metadata.generation
    events: list[tuple[str, str, str]] = []
    jobs = [c for c in live_children if c.get("kind") == "Job"]
    failure = _job_failure(jobs)

    phase: str = status.phase
    if phase in ("Pending", "Fetching"):
        if failure:
            phase = "Failed"
            events.append(("Warning", "FetchFailed", failure))
        elif jobs:
            phase = "Fetching"
    verified = is_condition_true(status.conditions, C.VERIFIED)
    cached = is_condition_true(status.conditions, C.CACHED)
    if verified and cached:
        ready = (True, "VerifiedAndCached",
                 f"{status.size_bytes or 0} bytes verified "
                 f"(sha256 {(status.sha256 or '')[:12]}...) and cached")
    elif phase == "Failed":
        reported = next((c for c in status.conditions
                         if c.type in (C.VERIFIED, C.CACHED) and c.status == "False"), None)
        ready = (False, reported.reason if reported else "FetchFailed",
                 reported.message if reported else failure or "the fetch Job failed")
    else:
        ready = (False, "Fetching" if jobs else "Pending",
                 "the fetch Job is downloading and verifying the artifact" if jobs
                 else "waiting for the fetch Job to start")
    conditions = set_condition(status.conditions, C.READY, ready[0], ready[1], ready[2],
                               generation, now)
    dump = [c.model_dump(by_alias=True, mode="json", exclude_none=True) for c in conditions]
    old = [c.model_dump(by_alias=True, mode="json", exclude_none=True) for c in status.conditions]
    patch: dict[str, Any] = {}
    if dump != old:
        patch["conditions"] = dump
    if phase != status.phase:
        patch["phase"] = phase
        if phase == "Failed" and status.progress is not None:
            # The Job died without reporting (deadline, evicted, OOM): its last figures stay,
            # but no longer as a download that is moving.
            stopped = stopped_status_progress(
                status.progress.model_dump(by_alias=True, mode="json"), now)
            if stopped is not None:
                patch["progress"] = stopped
    if status.observed_generation != generation:
        patch["observedGeneration"] = generation
    if ready[0] and status.phase == "Ready" and not any(
        c.type == C.READY and c.status == "True" for c in status.conditions
    ):
        events.append(("Normal", "Ready", ready[2]))
    return ModelVersionDecision(desired=desired, status_patch=patch, events=events)


def services_using(model_version: str, services: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Names of the GLMServices that want or serve `model_version`."""
    return [
        name for name, body in services.items()
        if body.get("spec", {}).get("modelVersion") == model_version
        or body.get("status", {}).get("stableModelVersion") == model_version
    ]
