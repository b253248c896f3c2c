"""What the fetch Job writes into its ModelVersion's status (pure), and the call that writes it.

    phase       Fetching while downloading, Ready when cached and verified, Failed otherwise
    progress    bytes done and total, rate, ETA and their one-line summary (the Progress
                column), at most every ~15 s while downloading (fetch/progress.py), the
                final figures with Ready, "Stopped at ..." with Failed
    sizeBytes, sha256, facts (the GGUF header, camelCase names: MLA, indexer, KDA and mHC
                keys and the per-layer head_count_kv / indexer.types arrays included),
                cache {claimName, path}
                for a safetensors folder: the total size, the snapshot digest, the facts of
                its config.json (fetch/hf_config.py) and the folder as cache.path
    conditions  Cached    True when the verified file sits under its final name in the cache
                Verified  True when sha256 and header check passed; False names the reason

Ready is the operator's summary condition and is left to it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from glm_operator.api.conditions import Condition, ConditionStatus, set_condition
from glm_operator.api.modelversion import (
    MAX_LAYER_LIST,
    DownloadProgress,
    ModelVersionConditionType,
    ModelVersionPhase,
)
from glm_operator.download_progress import stopped_status_progress
from glm_operator.fetch.download import FetchResult
from glm_operator.fetch.errors import FetchError
from glm_operator.fetch.gguf_header import GGUFFacts
from glm_operator.fetch.hf_config import facts_within_bounds
from glm_operator.fetch.progress import Progress
from glm_operator.fetch.snapshot import SnapshotResult
from glm_operator.kube.client import KubeError
from glm_operator.kube.modelversion_status import (
    ServiceAccountAccess,
    patch_modelversion_status,
    update_modelversion_status,
)

log = logging.getLogger("glm_operator.fetch")

CACHED = ModelVersionConditionType.CACHED.value
VERIFIED = ModelVersionConditionType.VERIFIED.value


@dataclass(frozen=True)
class StatusTarget:
    namespace: str
    name: str
    claim_name: str | None = None  # the cache PVC, echoed into status.cache


def _layer_list(values: list[int] | None) -> list[int] | None:
    """A per-layer array as the API takes it (at most MAX_LAYER_LIST entries); a longer one
    is left out rather than cut, which would change what it says."""
    return list(values) if values and len(values) <= MAX_LAYER_LIST else None


def facts_from_gguf(facts: GGUFFacts, size_bytes: int) -> dict[str, Any]:
    arch = facts.architecture

    def arch_int(suffix: str) -> int | None:
        value = facts.metadata.get(f"{arch}.{suffix}") if arch else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def arch_array(suffix: str) -> list[int] | None:
        return _layer_list(facts.arrays.get(f"{arch}.{suffix}")) if arch else None

    indexer_types = arch_array("attention.indexer.types")
    # Out-of-range header values are left out with a warning (facts_within_bounds).
    model = facts_within_bounds(dict(
        architecture=facts.architecture,
        block_count=facts.block_count,
        embedding_length=facts.embedding_length,
        head_count=facts.head_count,
        head_count_kv=facts.head_count_kv,
        key_length=facts.key_length,
        value_length=facts.value_length,
        context_length=facts.context_length,
        feed_forward_length=facts.feed_forward_length,
        expert_feed_forward_length=facts.expert_feed_forward_length,
        nextn_predict_layers=facts.nextn_predict_layers,
        expert_count=facts.expert_count,
        expert_used_count=facts.expert_used_count,
        vocab_size=facts.vocab_size,
        size_bytes=size_bytes or None,
        file_type=facts.file_type_name,
        head_count_kv_per_layer=arch_array("attention.head_count_kv"),
        kv_lora_rank=arch_int("attention.kv_lora_rank"),
        rope_dimension_count=arch_int("rope.dimension_count"),
        indexer_head_count=arch_int("attention.indexer.head_count"),
        indexer_key_length=arch_int("attention.indexer.key_length"),
        indexer_kpool=arch_int("attention.indexer.kpool"),
        indexer_types=[bool(t) for t in indexer_types] if indexer_types else None,
        kda_head_dim=arch_int("kda.head_dim"),
        ssm_conv_kernel=arch_int("ssm.conv_kernel"),
        hyper_connection_count=arch_int("hyper_connection.count"),
        nextn_weights_bytes=facts.nextn_tensor_bytes,
    ), "GGUF header")
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")


def _conditions(obj: Mapping[str, Any]) -> list[Condition]:
    raw = (obj.get("status") or {}).get("conditions") or []
    return [Condition.model_validate(c) for c in raw]


def _dump(conditions: list[Condition]) -> list[dict[str, Any]]:
    return [c.model_dump(by_alias=True, exclude_none=True, mode="json") for c in conditions]


def _generation(obj: Mapping[str, Any]) -> int | None:
    value = (obj.get("metadata") or {}).get("generation")
    return int(value) if value is not None else None


def progress_fields(progress: Progress, now: datetime | None = None) -> dict[str, Any]:
    """status.progress for a merge patch: every field named, absent ones as null, so a
    figure that no longer applies (an ETA once finished) is removed, not left behind."""
    model = DownloadProgress(
        summary=progress.summary,
        done_bytes=progress.done_bytes,
        total_bytes=progress.total_bytes,
        percent=progress.percent,
        bytes_per_second=(round(progress.bytes_per_second)
                          if progress.bytes_per_second is not None else None),
        eta_seconds=(math.ceil(progress.eta_seconds)
                     if progress.eta_seconds is not None and not progress.finished else None),
        resumed_bytes=progress.resumed_bytes,
        update_time=(now or datetime.now(UTC)).replace(microsecond=0),
    )
    return model.model_dump(by_alias=True, mode="json")


def stopped_progress(obj: Mapping[str, Any], now: datetime | None = None,
                     verb: str = "Stopped at") -> dict[str, Any] | None:
    return stopped_status_progress((obj.get("status") or {}).get("progress"), now, verb)


def fetching_status(obj: Mapping[str, Any], source: str, now: datetime | None = None) -> (
        dict[str, Any]):
    generation = _generation(obj)
    conditions = set_condition(_conditions(obj), CACHED, ConditionStatus.FALSE, "Downloading",
                               f"fetching {source}", generation, now)
    conditions = set_condition(conditions, VERIFIED, ConditionStatus.UNKNOWN, "NotYetDownloaded",
                               "verification runs when the download completes", generation, now)
    # An earlier attempt's figures are replaced by this one's first report, which counts
    # what that attempt left on disk as done.
    return {"phase": ModelVersionPhase.FETCHING.value, "observedGeneration": generation,
            "conditions": _dump(conditions),
            "progress": stopped_progress(obj, now, verb="Resuming from")}


def success_status(obj: Mapping[str, Any], result: FetchResult | SnapshotResult,
                   target: StatusTarget, relative_path: str, now: datetime | None = None,
                   progress: Progress | None = None) -> dict[str, Any]:
    generation = _generation(obj)
    pinned = bool((obj.get("spec") or {}).get("sha256"))
    what = "snapshot digest" if isinstance(result, SnapshotResult) else "sha256"
    checks = [f"{what} " + ("matches spec.sha256" if pinned
                            else "measured (no spec.sha256 to compare)")]
    if isinstance(result, SnapshotResult):
        checks.append(f"{len(result.files)} files checked against the source's sizes"
                      + (" and Hub checksums" if result.revision else ""))
        if result.facts is not None and result.facts.architecture:
            checks.append(f"config.json architecture={result.facts.architecture}")
    elif result.gguf is not None:
        checks.append(f"GGUF header architecture={result.gguf.architecture}")
    conditions = set_condition(
        _conditions(obj), VERIFIED, True, "Verified", "; ".join(checks), generation, now)
    where = f"{len(result.files)} files, " if isinstance(result, SnapshotResult) else ""
    conditions = set_condition(
        conditions, CACHED, True, "AlreadyCached" if result.from_cache else "Downloaded",
        f"{where}{result.size_bytes} bytes at {relative_path}"
        + (f" in PVC {target.claim_name}" if target.claim_name else ""), generation, now)
    status: dict[str, Any] = {
        "phase": ModelVersionPhase.READY.value,
        "observedGeneration": generation,
        "sizeBytes": result.size_bytes,
        "sha256": result.sha256,
        "cache": {"path": relative_path,
                  **({"claimName": target.claim_name} if target.claim_name else {})},
        "conditions": _dump(conditions),
        # The final figures when this Job downloaded; nothing when the cache already held it.
        "progress": progress_fields(progress, now) if progress is not None else None,
    }
    if isinstance(result, SnapshotResult):
        if result.facts is not None:
            status["facts"] = result.facts.model_dump(by_alias=True, exclude_none=True,
                                                      mode="json")
    elif result.gguf is not None:
        status["facts"] = facts_from_gguf(result.gguf, result.size_bytes)
    return status


def failure_status(obj: Mapping[str, Any], error: FetchError, now: datetime | None = None) -> (
        dict[str, Any]):
    generation = _generation(obj)
    message = str(error)
    conditions = set_condition(_conditions(obj), CACHED, ConditionStatus.FALSE, error.reason,
                               message, generation, now)
    if error.after_download:
        conditions = set_condition(conditions, VERIFIED, ConditionStatus.FALSE, error.reason,
                                   message, generation, now)
    else:
        conditions = set_condition(conditions, VERIFIED, ConditionStatus.UNKNOWN,
                                   "NotDownloaded", f"nothing to verify: {message}", generation,
                                   now)
    status: dict[str, Any] = {"phase": ModelVersionPhase.FAILED.value,
                              "observedGeneration": generation, "conditions": _dump(conditions)}
    stopped = stopped_progress(obj, now)
    if stopped is not None:
        status["progress"] = stopped
    return status


class StatusReporter:
    """Writes the three moments (fetching, success, failure) for one ModelVersion."""

    def __init__(self, access: ServiceAccountAccess, target: StatusTarget) -> None:
        self._client = access.client()
        self._target = target

    def fetching(self, source: str) -> None:
        self._write(lambda obj: fetching_status(obj, source))

    def succeeded(self, result: FetchResult | SnapshotResult, relative_path: str,
                  progress: Progress | None = None) -> None:
        self._write(lambda obj: success_status(obj, result, self._target, relative_path,
                                               progress=progress))

    def progress(self, progress: Progress) -> None:
        """A ProgressMeter's sink: one merge patch of status.progress. A failed write is
        logged and the download goes on; the next report (15 s on) tries again."""
        try:
            patch_modelversion_status(self._client, self._target.namespace, self._target.name,
                                      {"progress": progress_fields(progress)})
        except KubeError as exc:
            log.warning("could not write the progress into ModelVersion %s/%s: %s",
                        self._target.namespace, self._target.name, exc)

    def failed(self, error: FetchError) -> None:
        self._write(lambda obj: failure_status(obj, error))

    def _write(self, compute: Any) -> None:
        update_modelversion_status(self._client, self._target.namespace, self._target.name,
                                   compute)
        log.info("status of ModelVersion %s/%s updated", self._target.namespace,
                 self._target.name)
