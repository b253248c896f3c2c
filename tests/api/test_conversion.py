"""Conversion between v1alpha1 and v1alpha2 (api/conversion.py): the shapes each version
gets, and v1alpha1 -> v1alpha2 -> v1alpha1 giving back the object read."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from glm_operator.api import GLMService
from glm_operator.api.conversion import STASH_ANNOTATION, ConversionError, convert
from glm_operator.api.glmservice_v1alpha1 import GLMService as GLMServiceV1
from hypothesis import given, settings
from hypothesis import strategies as st

V1 = "serving.glm-operator.dev/v1alpha1"
V2 = "serving.glm-operator.dev/v1alpha2"


def v1(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": V1, "kind": "GLMService",
            "metadata": {"name": "chat", "namespace": "ns"},
            "spec": {"modelVersion": "m", "accelerator": {"profile": "nvidia-a10"},
                     "gateway": {"access": "Open"}, **spec}}


def test_engine_settings_move_under_the_engine_named() -> None:
    up = convert(v1(engine="vllm", kvCacheType="fp8", multiTokenPrediction=False,
                    parsers={"toolCall": "glm45"}, cpuOffload={"hostWeightsGiB": 4}), V2)
    assert up["apiVersion"] == V2
    assert up["spec"]["engine"] == {"vllm": {"kvCacheType": "fp8",
                                             "multiTokenPrediction": False,
                                             "parsers": {"toolCall": "glm45"},
                                             "cpuOffloadGiB": 4}}
    for gone in ("kvCacheType", "multiTokenPrediction", "parsers", "cpuOffload"):
        assert gone not in up["spec"]
    assert "annotations" not in up["metadata"]  # nothing stashed
    GLMService.model_validate(up)


def test_an_unnamed_engine_is_named_by_its_settings_and_unnamed_again() -> None:
    old = v1(kvCacheType="q8_0", loadMode="no-mmap")
    up = convert(old, V2)
    assert up["spec"]["engine"] == {"llamacpp": {"kvCacheType": "q8_0", "loadMode": "no-mmap"}}
    assert convert(up, V1) == old


def test_no_engine_and_no_setting_stays_unnamed() -> None:
    up = convert(v1(), V2)
    assert "engine" not in up["spec"]
    assert GLMService.model_validate(up).spec.engine_name is None


def test_the_long_context_pool_is_a_pool_and_its_defaults_are_left_out() -> None:
    up = convert(v1(longContext={"enabled": True, "contextLength": 65536, "concurrency": 1,
                                 "minReplicas": 0, "maxReplicas": 1, "queueLength": 1,
                                 "idleSeconds": 600}), V2)
    assert up["spec"]["longContext"] == {"contextLength": 65536, "concurrency": 1,
                                         "idleSeconds": 600}
    pool = GLMService.model_validate(up).spec.long_context
    assert pool is not None and (pool.min_replicas, pool.max_replicas, pool.queue_length) == (
        0, 1, 1)
    scaled = convert(v1(longContext={"enabled": True, "contextLength": 65536,
                                     "minReplicas": 1, "maxReplicas": 3, "queueLength": 2}), V2)
    assert scaled["spec"]["longContext"]["autoscaling"] == {
        "minReplicas": 1, "maxReplicas": 3, "targets": {"queueLength": 2}}


def test_what_v1alpha2_cannot_hold_is_stashed_and_given_back() -> None:
    store = {"redis": {"address": "redis.cache.svc:6379"}, "onUnavailable": "Deny",
             "timeout": "80ms"}
    old = v1(longContext={"enabled": False, "contextLength": 65536},
             gateway={"access": "Open",
                      "rateLimit": {"requestsPerMinute": 60, "store": store}})
    up = convert(old, V2)
    assert "longContext" not in up["spec"]
    assert "store" not in up["spec"]["gateway"]["rateLimit"]
    assert STASH_ANNOTATION in up["metadata"]["annotations"]
    GLMService.model_validate(up)
    assert convert(up, V1) == old


def test_routing_idle_seconds_is_the_pools() -> None:
    up = convert(v1(routing={"mode": "EndpointPicker", "idleSeconds": 900}), V2)
    assert up["spec"]["idleSeconds"] == 900 and "idleSeconds" not in up["spec"]["routing"]


def test_a_v1alpha1_object_without_routing_reads_back_without_routing() -> None:
    # Stored at v1alpha2, the API server defaults spec.idleSeconds (600); read at v1alpha1 it
    # must not grow a routing the object never had (the upgrade e2e found it did).
    old = v1()
    stored = convert(old, V2)
    stored["spec"]["idleSeconds"] = 600  # v1alpha2's schema default, as the API server adds it
    assert convert(stored, V1) == old
    stored["spec"]["idleSeconds"] = 900  # not the default: it has to be said somewhere
    assert convert(stored, V1)["spec"]["routing"] == {"idleSeconds": 900}


def test_model_versions_only_change_their_api_version() -> None:
    mv = {"apiVersion": V1, "kind": "ModelVersion", "metadata": {"name": "m"},
          "spec": {"format": "gguf"}}
    assert convert(mv, V2) == {**mv, "apiVersion": V2}


@pytest.mark.parametrize("obj,version", [
    ({"apiVersion": "other.dev/v1", "kind": "GLMService"}, V2),
    ({"apiVersion": V1, "kind": "Pod"}, V2),
    ({"apiVersion": V1, "kind": "GLMService"}, "serving.glm-operator.dev/v9"),
    ([], V2),
    ({"apiVersion": V1, "kind": "GLMService", "spec": {"engine": {"vllm": {}}}}, V2),
])
def test_what_is_not_ours_is_refused_with_a_reason(obj: Any, version: str) -> None:
    with pytest.raises(ConversionError):
        convert(obj, version)


def test_the_input_is_not_changed() -> None:
    old = v1(engine="llamacpp", kvCacheType="q8_0", routing={"idleSeconds": 900})
    kept = copy.deepcopy(old)
    convert(old, V2)
    assert old == kept


# --- the round trip over admitted v1alpha1 objects -------------------------------------

llama_settings = st.fixed_dictionaries({}, optional={
    "kvCacheType": st.sampled_from(["f16", "q8_0", "q4_0"]),
    "kvUnified": st.booleans(),
    "loadMode": st.sampled_from(["mmap", "no-mmap"]),
    "cpuOffload": st.builds(lambda n: {"acceleratorLayers": n}, st.integers(1, 80)),
})
vllm_settings = st.fixed_dictionaries({}, optional={
    "kvCacheType": st.sampled_from(["auto", "fp8"]),
    "multiTokenPrediction": st.booleans(),
    "parsers": st.just({"toolCall": "glm45", "reasoning": "glm45"}),
    "cpuOffload": st.builds(lambda n: {"hostWeightsGiB": n}, st.integers(1, 64)),
})
long_context = st.fixed_dictionaries(
    {"enabled": st.booleans(), "contextLength": st.just(131072)},
    optional={"concurrency": st.integers(1, 8), "minReplicas": st.integers(0, 1),
              "maxReplicas": st.integers(1, 4), "queueLength": st.integers(1, 3),
              "idleSeconds": st.integers(30, 3600)})


@st.composite
def admitted_v1(draw: st.DrawFn) -> dict[str, Any]:
    engine = draw(st.sampled_from([None, "llamacpp", "vllm"]))
    settings_of = draw(vllm_settings if engine == "vllm" or (
        engine is None and draw(st.booleans())) else llama_settings)
    spec: dict[str, Any] = dict(settings_of)
    if engine is not None:
        spec["engine"] = engine
    if draw(st.booleans()):
        lc = draw(long_context)
        lc["maxReplicas"] = max(lc.get("maxReplicas", 1), lc.get("minReplicas", 0))
        spec["longContext"] = lc
    if draw(st.booleans()):
        spec["routing"] = {"idleSeconds": draw(st.integers(30, 3600))}
    return v1(**spec)


@settings(max_examples=300, deadline=None)
@given(admitted_v1())
def test_v1alpha1_to_v1alpha2_and_back_loses_nothing(written: dict[str, Any]) -> None:
    # An object the v1alpha1 API admits, with its defaults filled as the API server stores it
    # (conversion sees only stored objects and what the API server read and defaulted).
    old = GLMServiceV1.model_validate(written).model_dump(
        by_alias=True, exclude_none=True, mode="json", exclude={"status"})
    up = convert(old, V2)
    GLMService.model_validate(up)  # one v1alpha2 admits
    assert convert(up, V1) == old


# --- the round trip over v1alpha2 objects read and written at v1alpha1 ---------------------

vllm_v2 = st.fixed_dictionaries({}, optional={
    "kvCacheType": st.sampled_from(["auto", "fp8"]),
    "layout": st.sampled_from(["tp", "dcp"]),
    "kvOffloadGiB": st.integers(1, 512),
    "multiTokenPrediction": st.booleans(),
})


@st.composite
def admitted_v2(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"modelVersion": "m", "accelerator": {"profile": "nvidia-h200",
                                                               "count": 8},
                            "gateway": {"access": "Open"}}
    if draw(st.booleans()):
        vllm = draw(vllm_v2)
        if draw(st.booleans()):
            vllm.update(layout="dep", rankTensorParallel=draw(st.sampled_from([1, 2])))
        spec["engine"] = {"vllm": vllm}
    if draw(st.booleans()):
        pool: dict[str, Any] = {"contextLength": 262144}
        sizing = draw(st.sampled_from(["none", "replicas", "autoscaling"]))
        if sizing == "replicas":
            pool["replicas"] = draw(st.integers(0, 3))
        elif sizing == "autoscaling":
            pool["autoscaling"] = {"minReplicas": 0, "maxReplicas": draw(st.integers(1, 4)),
                                   "targets": {"queueLength": 2}}
        spec["longContext"] = pool
    return {"apiVersion": V2, "kind": "GLMService",
            "metadata": {"name": "chat", "namespace": "ns"}, "spec": spec}


@settings(max_examples=200, deadline=None)
@given(admitted_v2())
def test_v1alpha2_to_v1alpha1_and_back_loses_nothing(written: dict[str, Any]) -> None:
    new = GLMService.model_validate(written).model_dump(
        by_alias=True, exclude_none=True, mode="json", exclude={"status"})
    down = convert(new, V1)
    GLMServiceV1.model_validate(down)  # v1alpha1 admits what it is shown
    # The API server defaults what it converts, by the version's schema: so does the model.
    back = GLMService.model_validate(convert(down, V2)).model_dump(
        by_alias=True, exclude_none=True, mode="json", exclude={"status"})
    assert back == new
