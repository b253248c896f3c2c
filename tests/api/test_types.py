"""The API types accept what users write and refuse cross-field mistakes with the field named."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from glm_operator.api import (
    ADMITTED,
    Access,
    Condition,
    ConditionStatus,
    GLMService,
    GLMServiceSpec,
    ModelVersion,
    ModelVersionSpec,
    get_condition,
    is_condition_true,
    set_condition,
)
from pydantic import ValidationError


def service_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "modelVersion": "glm4-9b-q4km",
        "accelerator": {"profile": "nvidia-a10"},
        "gateway": {"apiKeysSecret": "keys"},
    }
    spec.update(overrides)
    return spec


def test_minimal_service_gets_documented_defaults() -> None:
    spec = GLMServiceSpec.model_validate(service_spec())
    assert spec.model_version == "glm4-9b-q4km"
    assert spec.engine is None  # decided from the ModelVersion format
    assert spec.accelerator.count == 1
    assert spec.context_length == 8192
    assert spec.concurrency == 4
    assert spec.effective_replicas == 1
    assert spec.rollout.strategy == "surge"
    assert spec.gateway.audit.enabled is True
    assert spec.gateway.audit.include_prompts is False
    assert spec.gateway.effective_access == Access.API_KEYS
    assert spec.gateway.max_drain_seconds == 300


def test_wire_names_are_camel_case_and_round_trip() -> None:
    raw = service_spec(
        contextLength=32768,
        longContext={"contextLength": 131072},
        autoscaling={"minReplicas": 1, "maxReplicas": 4, "targets": {"queueLength": 2}},
        gateway={"apiKeysSecret": "keys", "rateLimit": {"requestsPerMinute": 60, "burst": 10}},
    )
    spec = GLMServiceSpec.model_validate(raw)
    dumped = spec.model_dump(by_alias=True, exclude_none=True)
    assert dumped["longContext"]["contextLength"] == 131072
    assert dumped["gateway"]["rateLimit"] == {"requestsPerMinute": 60, "burst": 10}
    assert GLMServiceSpec.model_validate(dumped) == spec


def test_unknown_spec_field_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match="contextLenght"):
        GLMServiceSpec.model_validate(service_spec(contextLenght=4096))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"replicas": 2, "autoscaling": {"maxReplicas": 3, "targets": {"queueLength": 1}}},
            "replicas and autoscaling are mutually exclusive",
        ),
        (
            {"autoscaling": {"minReplicas": 5, "maxReplicas": 3, "targets": {"queueLength": 1}}},
            "minReplicas",
        ),
        ({"autoscaling": {"maxReplicas": 3, "targets": {}}}, "needs at least one of"),
        ({"engine": {"vllm": {}}, "accelerator": {"profile": "cpu"}},
         "vllm does not run on the cpu"),
        ({"accelerator": {"profile": "cpu", "count": 2}}, "count must be 1 on the cpu"),
        ({"contextLength": 100}, "contextLength"),
        (
            {"contextLength": 32768, "longContext": {"contextLength": 16384}},
            "longContext.contextLength",
        ),
        ({"longContext": {}}, "longContext.contextLength is required"),
        ({"rollout": {"strategy": "canary", "steps": [10, 50, 25]}}, "strictly ascending"),
        ({"rollout": {"strategy": "canary", "steps": [10, 10]}}, "strictly ascending"),
        ({"rollout": {"strategy": "canary", "steps": [10, 150]}}, "between 1 and 100"),
        ({"rollout": {"strategy": "surge", "steps": [10, 50]}}, "only to strategy canary"),
        ({"engineArgs": ["--ctx-size", "4096"]}, "--ctx-size"),
        ({"engineArgs": ["--port=9000"]}, "--port=9000"),
        ({"podOverrides": {"labels": {"glm-operator.dev/pool": "x"}}}, "reserved prefix"),
        ({"gateway": {"rateLimit": {"burst": 5}}}, "requestsPerMinute or tokensPerMinute"),
        ({"rollout": {"interval": "five minutes"}}, "interval"),
        ({"modelVersion": "Not_A_Name"}, "modelVersion"),
        ({"gateway": {}}, "apiKeysSecret is required"),
        ({"gateway": {"access": "APIKeys"}}, "apiKeysSecret is required"),
        ({"gateway": {"access": "Open", "apiKeysSecret": "keys"}}, "remove one of them"),
        ({"gateway": {"apiKeysSecret": "keys", "maxDrainSeconds": 0}}, "maxDrainSeconds"),
        ({"gateway": {"apiKeysSecret": "keys", "maxDrainSeconds": 3601}}, "maxDrainSeconds"),
    ],
)
def test_invalid_service_specs_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace(".", r"\.")):
        GLMServiceSpec.model_validate(service_spec(**overrides))


def test_open_access_is_a_choice() -> None:
    spec = GLMServiceSpec.model_validate(service_spec(gateway={"access": "Open"}))
    assert spec.gateway.effective_access == Access.OPEN


def test_an_admitted_object_from_before_the_choice_still_parses() -> None:
    """A GLMService stored before spec.gateway.access existed: the API server admitted it,
    so the operator parses it (and reports OpenAccess) instead of failing its reconcile."""
    legacy = service_spec(gateway={"rateLimit": {"requestsPerMinute": 60}})
    with pytest.raises(ValidationError, match="apiKeysSecret is required"):
        GLMServiceSpec.model_validate(legacy)
    spec = GLMServiceSpec.model_validate(legacy, context={ADMITTED: True})
    assert spec.gateway.effective_access is None
    # The API server's rules are not run again on what it admitted; offline they are.
    with pytest.raises(ValidationError, match="remove one of them"):
        GLMServiceSpec.model_validate(
            service_spec(gateway={"access": "Open", "apiKeysSecret": "k"}))


def test_allowed_engine_args_pass() -> None:
    spec = GLMServiceSpec.model_validate(service_spec(engineArgs=["--flash-attn", "on", "--jinja"]))
    assert spec.engine_args == ["--flash-attn", "on", "--jinja"]


def test_canary_steps_default_when_unset() -> None:
    spec = GLMServiceSpec.model_validate(service_spec(rollout={"strategy": "canary"}))
    assert spec.rollout.effective_steps == (10, 25, 50)


@pytest.mark.parametrize(
    "uri",
    [
        "https://models.example.com/glm-4-9b-chat-Q4_K_M.gguf",
        "http://minio.minio:9000/models/glm.gguf",
        "s3://models-bucket/glm4/glm-4-9b-chat-Q4_K_M.gguf",
        "hf://THUDM/glm-4-9b-chat-GGUF/glm-4-9b-chat-Q4_K_M.gguf?revision=main",
        "hf://zai-org/GLM-4.5-Air-FP8?revision=abc123",
        "pvc://models/glm4/glm-4-9b-chat-Q4_K_M.gguf",
    ],
)
def test_accepted_source_uris(uri: str) -> None:
    spec = ModelVersionSpec.model_validate({"source": {"uri": uri}, "format": "gguf"})
    assert spec.source.uri == uri


@pytest.mark.parametrize(
    "uri", ["ftp://x/y", "s3://bucket-only", "hf://just-org", "pvc://Claim/x", "file:///m.gguf"]
)
def test_refused_source_uris(uri: str) -> None:
    with pytest.raises(ValidationError, match=r"source\.uri must be one of"):
        ModelVersionSpec.model_validate({"source": {"uri": uri}, "format": "gguf"})


def test_model_version_sha256_and_facts() -> None:
    with pytest.raises(ValidationError, match="sha256"):
        ModelVersionSpec.model_validate(
            {"source": {"uri": "pvc://m/a.gguf"}, "format": "gguf", "sha256": "ABC"}
        )
    spec = ModelVersionSpec.model_validate(
        {
            "source": {"uri": "pvc://m/a.gguf"},
            "format": "gguf",
            "facts": {"blockCount": 40, "headCountKv": 2, "nextnPredictLayers": 0},
        }
    )
    assert spec.facts is not None
    assert (spec.facts.block_count, spec.facts.head_count_kv) == (40, 2)


def test_whole_objects_parse_from_api_server_dicts() -> None:
    service = GLMService.model_validate(
        {
            "apiVersion": "serving.glm-operator.dev/v1alpha2",
            "kind": "GLMService",
            "metadata": {"name": "chat", "namespace": "ai", "generation": 3, "managedFields": []},
            "spec": service_spec(),
            "status": {"observedGeneration": 2, "stableModelVersion": "old", "futureField": 1},
        }
    )
    assert service.metadata.generation == 3
    assert service.status.stable_model_version == "old"
    version = ModelVersion.model_validate(
        {"metadata": {"name": "m"}, "spec": {"source": {"uri": "pvc://m/a"}, "format": "gguf"}}
    )
    assert version.status.phase == "Pending"
    with pytest.raises(ValidationError):
        GLMService.model_validate({"kind": "ModelVersion", "spec": service_spec()})


def test_set_condition_moves_transition_time_only_on_status_change() -> None:
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    t1 = datetime(2025, 1, 2, tzinfo=UTC)
    t2 = datetime(2025, 1, 3, tzinfo=UTC)
    conditions = set_condition([], "Ready", False, "Planning", "planning", 1, now=t0)
    conditions = set_condition(conditions, "Planned", True, "Fits", "fits", 1, now=t0)
    same = set_condition(conditions, "Ready", False, "Waiting", "pods starting", 2, now=t1)
    ready = get_condition(same, "Ready")
    assert ready is not None
    assert ready.last_transition_time == t0  # status unchanged
    assert (ready.reason, ready.message, ready.observed_generation) == (
        "Waiting",
        "pods starting",
        2,
    )
    flipped = set_condition(same, "Ready", ConditionStatus.TRUE, "Serving", "", 2, now=t2)
    ready = get_condition(flipped, "Ready")
    assert ready is not None and ready.last_transition_time == t2
    assert [c.type for c in flipped] == ["Ready", "Planned"]  # order kept, no duplicates
    assert is_condition_true(flipped, "Ready") and not is_condition_true(same, "Ready")
    assert len(conditions) == 2 and get_condition(conditions, "Ready").reason == "Planning"  # type: ignore[union-attr]


def test_condition_serialises_like_metav1() -> None:
    condition = Condition(
        type="Ready",
        status=ConditionStatus.FALSE,
        reason="PlanInfeasible",
        message="needs 45.3 GiB, nvidia-a10 has 24 GiB",
        observed_generation=4,
        last_transition_time=datetime(2025, 1, 1, tzinfo=UTC),
    )
    assert condition.model_dump(by_alias=True, mode="json") == {
        "type": "Ready",
        "status": "False",
        "observedGeneration": 4,
        "lastTransitionTime": "2025-01-01T00:00:00Z",
        "reason": "PlanInfeasible",
        "message": "needs 45.3 GiB, nvidia-a10 has 24 GiB",
    }
    with pytest.raises(ValidationError, match="reason"):
        Condition(
            type="Ready",
            status=ConditionStatus.TRUE,
            reason="not camel",
            last_transition_time=datetime(2025, 1, 1, tzinfo=UTC),
        )


def test_plan_summary_keeps_everything_the_planner_reports() -> None:
    """status.plan stores Plan.summary(); a field the schema lacks would be pruned."""
    from glm_operator.api import PlanSummary
    from glm_operator.planning.facts import ArchitectureFacts as PlannerFacts
    from glm_operator.planning.planner import PlanRequest, plan
    from pydantic.alias_generators import to_camel

    facts = PlannerFacts(
        architecture="glm4",
        block_count=40,
        embedding_length=4096,
        head_count=32,
        head_count_kv=2,
        context_length=32768,
        key_length=128,
        value_length=128,
        parameter_count=9_400_000_000,
        vocab_size=151552,
    )
    for engine, accelerator, quantization in (
        ("llamacpp", "nvidia-a10", "Q4_K_M"),
        ("vllm", "nvidia-a100-80gb", "bf16"),
    ):
        summary = plan(
            PlanRequest(
                facts=facts,
                quantization=quantization,
                engine=engine,  # type: ignore[arg-type]
                accelerator=accelerator,
                context_length=32768,
                concurrency=4,
            )
        ).summary()
        stored = PlanSummary.model_validate(summary).model_dump(by_alias=True, exclude_none=True)
        for section in ("memory", "resources", engine):
            for key in summary[section]:
                camel = to_camel(key)
                assert camel in stored[section], f"status.plan.{section}.{camel} would be lost"
        assert stored["engine"] == engine and stored["accelerator"] == accelerator
        assert set(summary) - {"alternatives"} <= set(stored) | {"alternatives"}


# --- spec.routing and scale from zero -------------------------------------------------------

AUTOSCALED_FROM_ZERO = {"minReplicas": 0, "maxReplicas": 4, "targets": {"queueLength": 2}}


def test_routing_defaults_to_the_service_and_its_documented_values() -> None:
    spec = GLMServiceSpec.model_validate(service_spec())
    assert spec.routing.mode == "Service" and not spec.endpoint_picker
    assert (spec.routing.failure_mode, spec.routing.router_replicas, spec.idle_seconds,
            spec.routing.max_waiting_requests) == ("FailOpen", 2, 600, 256)
    assert not spec.main_pool_may_sleep


def test_min_replicas_zero_is_scale_from_zero_with_the_endpoint_picker() -> None:
    spec = GLMServiceSpec.model_validate(service_spec(
        routing={"mode": "EndpointPicker"}, idleSeconds=120, autoscaling=AUTOSCALED_FROM_ZERO))
    assert spec.endpoint_picker and spec.main_pool_may_sleep
    # Auto may still resolve to the HPA; only an explicit KEDA is refused.
    assert spec.autoscaling is not None and spec.autoscaling.scaler == "Auto"


@pytest.mark.parametrize(("overrides", "message"), [
    ({}, "needs spec.routing.mode EndpointPicker"),
    ({"routing": {"mode": "Service"}}, "needs spec.routing.mode EndpointPicker"),
    ({"routing": {"mode": "EndpointPicker"},
      "autoscaling": {**AUTOSCALED_FROM_ZERO, "scaler": "KEDA"}}, "KEDA is not built yet"),
    ({"routing": {"mode": "EndpointPicker"},
      "accelerator": {"profile": "nvidia-a10", "nodes": 2}}, "multi-node replicas"),
])
def test_min_replicas_zero_is_refused_where_nothing_would_wake_the_pool(
        overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        GLMServiceSpec.model_validate(service_spec(
            **{"autoscaling": AUTOSCALED_FROM_ZERO, **overrides}))


def test_endpoint_picker_with_min_replicas_one_or_fixed_replicas_is_fine() -> None:
    # The control of the rules above: they are about minReplicas 0 only.
    for overrides in ({"autoscaling": {**AUTOSCALED_FROM_ZERO, "minReplicas": 1,
                                       "scaler": "KEDA"}},
                      {"replicas": 3}, {"replicas": 0}):
        spec = GLMServiceSpec.model_validate(service_spec(
            routing={"mode": "EndpointPicker"}, **overrides))
        assert spec.endpoint_picker and not spec.main_pool_may_sleep


def test_the_crd_carries_the_scale_from_zero_rules_with_their_messages() -> None:
    from glm_operator.api.crdgen import structural_schema
    from glm_operator.api.glmservice import (
        SCALE_FROM_ZERO_NEEDS_PICKER,
        SCALE_FROM_ZERO_NOT_MULTI_NODE,
        SCALE_FROM_ZERO_NOT_WITH_KEDA,
    )

    rules = {r["message"]: r for r in
             structural_schema(GLMServiceSpec)["x-kubernetes-validations"]}
    for message in (SCALE_FROM_ZERO_NEEDS_PICKER, SCALE_FROM_ZERO_NOT_WITH_KEDA,
                    SCALE_FROM_ZERO_NOT_MULTI_NODE):
        assert rules[message]["fieldPath"] == ".autoscaling.minReplicas"
        assert "self.autoscaling.minReplicas != 0" in rules[message]["rule"]
    assert "spec.autoscaling.minReplicas" in SCALE_FROM_ZERO_NEEDS_PICKER
    assert "spec.routing.mode" in SCALE_FROM_ZERO_NEEDS_PICKER
