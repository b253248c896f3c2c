"""The ServiceMonitor scrapes the gateway's series and, through it, the engine's."""

from __future__ import annotations

from glm_operator.render.monitoring import build_service_monitor, pod_label_meta
from glm_operator.wellknown import POOL_LABEL, SERVICE_LABEL, VERSION_LABEL


def test_the_engines_series_are_scraped_through_the_gateway_with_our_labels() -> None:
    monitor = build_service_monitor("glm", "ns", {}, None, {"a": "b"}, "gateway")
    gateway, engine = monitor["spec"]["endpoints"]
    assert (gateway["path"], gateway["honorLabels"]) == ("/metrics", True)
    assert engine["path"] == "/metrics/engine" and engine["port"] == "gateway"
    # The engine's series carry none of our labels: the pod's give them the gateway's.
    assert "honorLabels" not in engine
    assert {(r["sourceLabels"][0], r["targetLabel"]) for r in engine["relabelings"]} == {
        (pod_label_meta(SERVICE_LABEL), "service"),
        (pod_label_meta(VERSION_LABEL), "model_version"),
        (pod_label_meta(POOL_LABEL), "pool")}


def test_pod_labels_are_named_as_prometheus_discovers_them() -> None:
    assert pod_label_meta("glm-operator.dev/service") == \
        "__meta_kubernetes_pod_label_glm_operator_dev_service"
