"""The KEDA ScaledObject of the main pool, and when it replaces the plain HPA."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from glm_operator.api import Scaler
from glm_operator.cli import main
from glm_operator.config import OperatorConfig
from glm_operator.render.autoscaling import hpa_behavior
from glm_operator.render.deployment import INITIAL_REPLICAS_ANNOTATION
from glm_operator.render.keda import threshold
from glm_operator.render.output import to_yaml
from glm_operator.render.scaler import choose_scaler
from glm_operator.render.scaling_metrics import BY_TARGET_FIELD, SIGNALS
from glm_operator.render.service import Capabilities, render_service

from render.cases import NAMESPACE, inputs, model_version, service
from render.golden import check_golden
from render.test_render_cli import mv_manifest, offline_service, write

PROMETHEUS = "http://prometheus-operated.monitoring:9090"
KEDA_CONFIG = OperatorConfig(imageTag="0.1.0", prometheus={"url": PROMETHEUS})
# Device memory above the A10 plan (about 51 %) and within the HPA's reach (90 % at most).
ALL_TARGETS = {"requestsPerSecond": 2.5, "queueLength": 4, "kvCacheUtilization": 80,
               "acceleratorMemoryUtilization": 90}


def autoscaled(targets: dict[str, Any] | None = None, **autoscaling: Any) -> Any:
    return service("llamacpp", "a10", autoscaling={
        "minReplicas": 2, "maxReplicas": 6, "targets": targets or ALL_TARGETS,
        "behavior": {"scaleUp": {"stabilizationWindowSeconds": 30}}, **autoscaling})


def render(svc: Any, keda: bool = True, config: OperatorConfig = KEDA_CONFIG) -> list[Any]:
    return render_service(inputs(svc, model_version("gguf"), config=config,
                                 capabilities=Capabilities(keda=keda)))


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def test_golden_scaled_object_with_every_target() -> None:
    (scaled,) = by_kind(render(autoscaled()), "ScaledObject")
    check_golden("scaledobject-all-targets.yaml", to_yaml([scaled]))


def test_scaled_object_scales_the_main_deployment_like_the_hpa_would() -> None:
    svc = autoscaled()
    objects = render(svc)
    assert by_kind(objects, "HorizontalPodAutoscaler") == []  # KEDA creates its own
    (scaled,) = by_kind(objects, "ScaledObject")
    main = by_kind(objects, "Deployment")[0]
    spec = scaled["spec"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                      "name": main["metadata"]["name"]}
    assert scaled["metadata"]["name"] == main["metadata"]["name"]  # where the HPA would be
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 6)
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == hpa_behavior(
        svc.spec.autoscaling)
    # The same replicas handover as with the HPA: the Deployment leaves replicas out.
    assert "replicas" not in main["spec"]
    assert main["metadata"]["annotations"][INITIAL_REPLICAS_ANNOTATION] == "2"
    owner = scaled["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "GLMService" and owner["controller"] is True


def test_one_prometheus_trigger_per_target_with_the_catalogue_query() -> None:
    (scaled,) = by_kind(render(autoscaled()), "ScaledObject")
    triggers = scaled["spec"]["triggers"]
    assert [t["name"] for t in triggers] == [s.target_field for s in SIGNALS]
    for trigger in triggers:
        signal = BY_TARGET_FIELD[trigger["name"]]
        assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
        meta = trigger["metadata"]
        # KEDA's CRD types trigger metadata as a map of strings.
        assert all(isinstance(v, str) for v in meta.values())
        assert meta["serverAddress"] == PROMETHEUS
        assert meta["query"] == signal.pool_query(NAMESPACE, "chat", "glm4-9b-q4", "main")
        assert float(meta["threshold"]) == ALL_TARGETS[signal.target_field]


def test_only_the_targets_set_become_triggers() -> None:
    (scaled,) = by_kind(render(autoscaled({"queueLength": 3})), "ScaledObject")
    assert [(t["name"], t["metadata"]["threshold"]) for t in scaled["spec"]["triggers"]] == [
        ("queueLength", "3")]


@pytest.mark.parametrize(("value", "text"), [
    (0.5, "0.5"), (2.5, "2.5"), (0.001, "0.001"), (30, "30"), (100000.0, "100000"),
    (12345.678, "12345.678"),
])
def test_thresholds_are_plain_decimals_keda_can_parse(value: float, text: str) -> None:
    # KEDA reads the threshold with strconv.ParseFloat: "500m" or "1e+05" would be refused.
    assert threshold(value) == text


def test_auto_takes_keda_only_with_its_crd_and_a_prometheus_address() -> None:
    svc = autoscaled()
    assert by_kind(render(svc), "ScaledObject")
    without_crd = render(svc, keda=False)
    without_url = render(svc, config=OperatorConfig(imageTag="0.1.0"))
    for objects in (without_crd, without_url):
        assert by_kind(objects, "ScaledObject") == []
        assert len(by_kind(objects, "HorizontalPodAutoscaler")) == 1


def test_hpa_asked_for_stays_an_hpa_where_keda_is_possible() -> None:
    objects = render(autoscaled(scaler="HPA"))
    assert by_kind(objects, "ScaledObject") == []
    assert len(by_kind(objects, "HorizontalPodAutoscaler")) == 1


def test_keda_asked_for_and_impossible_renders_no_autoscaler_at_all() -> None:
    objects = render(autoscaled(scaler="KEDA"), keda=False)
    assert by_kind(objects, "ScaledObject") == by_kind(objects, "HorizontalPodAutoscaler") == []
    main = by_kind(objects, "Deployment")[0]
    assert "replicas" not in main["spec"]  # the pool keeps whatever it runs


@pytest.mark.parametrize(("asked", "keda", "url", "scaler", "words"), [
    ("Auto", True, PROMETHEUS, Scaler.KEDA, ["served", "prometheus.url is set"]),
    ("Auto", False, PROMETHEUS, Scaler.HPA, ["scaledobjects.keda.sh", "not served"]),
    ("Auto", True, None, Scaler.HPA, ["no Prometheus address"]),
    ("HPA", True, PROMETHEUS, Scaler.HPA, ["scaler is HPA"]),
    ("KEDA", True, PROMETHEUS, Scaler.KEDA, ["scaler is KEDA"]),
    ("KEDA", False, PROMETHEUS, None, ["not served", "install KEDA", "set "
                                       "spec.autoscaling.scaler to HPA or Auto"]),
    ("KEDA", True, None, None, ["no Prometheus address", "helm value prometheus.url"]),
    ("KEDA", False, None, None, ["install KEDA", "prometheus.url"]),
])
def test_scaler_choice_says_why(asked: str, keda: bool, url: str | None,
                                scaler: Scaler | None, words: list[str]) -> None:
    autoscaling = autoscaled(scaler=asked).spec.autoscaling
    assert autoscaling is not None
    choice = choose_scaler(autoscaling, keda, url)
    assert choice.scaler == scaler
    for word in words:
        assert word in choice.why


def test_render_cli_renders_the_scaled_object_with_keda_and_a_prometheus_address(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "operator.yaml"
    config.write_text(yaml.safe_dump({"prometheus": {"url": PROMETHEUS}}))
    svc = write(tmp_path, "all.yaml", offline_service(
        autoscaling={"maxReplicas": 3, "targets": {"queueLength": 2}}), mv_manifest("gguf"))
    args = ["render", "-f", svc, "--config", str(config), "--no-model-version-children"]
    assert main([*args, "--keda"]) == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert "ScaledObject" in kinds and "HorizontalPodAutoscaler" not in kinds
    assert main(args) == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert "HorizontalPodAutoscaler" in kinds and "ScaledObject" not in kinds


def test_a_target_the_plan_makes_meaningless_is_left_out_as_in_the_hpa() -> None:
    cpu = service("llamacpp", "cpu", concurrency=2, contextLength=8192, autoscaling={
        "maxReplicas": 3, "targets": {"queueLength": 2, "acceleratorMemoryUtilization": 90}})
    (scaled,) = by_kind(render(cpu), "ScaledObject")
    assert [t["name"] for t in scaled["spec"]["triggers"]] == ["queueLength"]
    only_memory = service("llamacpp", "cpu", concurrency=2, contextLength=8192, autoscaling={
        "maxReplicas": 3, "targets": {"acceleratorMemoryUtilization": 90}})
    objects = render(only_memory)
    assert by_kind(objects, "ScaledObject") == by_kind(objects, "HorizontalPodAutoscaler") == []
