"""Every rule of the shipped prometheus-adapter config, evaluated by a real Prometheus.

charts/glm-operator/files/prometheus-adapter-rules.yaml (generated from
render/scaling_metrics.py) is what a cluster's prometheus-adapter loads. Here Debian's
Prometheus scrapes what those rules read, for fake pods:
- stand-in gateways serving the gateway's own metrics (GatewayMetrics: its series names,
  labels and recording code), scraped with honorLabels as the operator's ServiceMonitor does;
- dcgm-exporter and npu-exporter stand-ins (e2e/device_exporters.py) with the exporters'
  own series and labels, scraped the ways clusters scrape them.
Each rule goes through prometheus-adapter's discovery, naming and query templating
(e2e/adapter_rules.py), and the per-pod answer must be the value the HPA is meant to see.
No cluster is needed.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml
from glm_operator.gateway.metrics import REQUESTS_TOTAL
from glm_operator.render import scaling_metrics
from glm_operator.render.scaling_metrics import (
    ACCELERATOR_MEMORY_UTILIZATION,
    KV_CACHE_UTILIZATION,
    QUEUE_LENGTH,
    REQUESTS_PER_SECOND,
    SIGNALS,
)

from e2e.adapter_rules import Rule, discover, load_rules, per_pod_values
from e2e.conftest import in_ci
from e2e.device_exporters import DcgmExporter, NpuExporter
from e2e.gateway_standin import GatewayStandIn
from e2e.prometheus import PrometheusError, PrometheusServer, binary_missing_reason, prometheus

__all__ = ["prometheus"]  # fixture used by name

RULES_FILE = (Path(__file__).resolve().parent.parent / "charts" / "glm-operator" / "files"
              / "prometheus-adapter-rules.yaml")
SERVICE = "chat"
SCRAPED = 40.0  # seconds to wait for series

# Pod a: 10 requests/s, of which 40 % refused (429, 401) and 10 % failed (500): 6 served.
# Pod b: 6 requests/s, all served. The HPA must see the same load on both.
RATE_A, REFUSED_A, FAILED_A = 10.0, 0.4, 0.1
RATE_B = RATE_A * (1 - REFUSED_A)


@pytest.fixture(scope="module")
def rules() -> list[Rule]:
    return load_rules(RULES_FILE)


def test_the_shipped_file_is_the_catalogue_and_serves_every_signal(rules: list[Rule]) -> None:
    assert yaml.safe_load(RULES_FILE.read_text()) == scaling_metrics.adapter_config()
    named = {rule.metric_name(s.series) for rule in rules for s in SIGNALS}
    assert {s.hpa_metric for s in SIGNALS} <= named


@pytest.fixture(scope="module")
def gateways(prometheus: PrometheusServer) -> Iterator[tuple[str, GatewayStandIn,
                                                             GatewayStandIn]]:
    namespace = f"e2e-rules-{uuid.uuid4().hex[:5]}"
    with ExitStack() as stack:
        a, b = (stack.enter_context(GatewayStandIn(namespace, SERVICE, "v1", pod=f"{SERVICE}-{x}"))
                for x in ("a", "b"))
        for standin in (a, b):
            standin.register(prometheus)
        a.set_traffic(RATE_A, error_ratio=FAILED_A, client_error_ratio=REFUSED_A)
        b.set_traffic(RATE_B)
        a.set_load(in_flight=2, queued=3)
        b.set_load(in_flight=1, queued=0)
        a.set_kv_cache_usage(0.42)
        b.set_kv_cache_usage(0.9)
        for standin in (a, b):
            prometheus.wait_for_series(
                f'rate({REQUESTS_TOTAL}{{pod="{standin.pod}"}}[{scaling_metrics.RATE_WINDOW}])'
                " > 0", timeout=SCRAPED)
        yield namespace, a, b


def test_requests_per_second_counts_served_requests_not_refusals(
        prometheus: PrometheusServer, rules: list[Rule],
        gateways: tuple[str, GatewayStandIn, GatewayStandIn]) -> None:
    namespace, a, b = gateways
    values = per_pod_values(prometheus, rules, REQUESTS_PER_SECOND.hpa_metric, namespace,
                            [a.pod, b.pod])
    # rate() over the rule's window while the window fills: each pod is compared with its own
    # series over the same window, so the two stand-ins' start and scrape times do not matter.
    window = scaling_metrics.RATE_WINDOW

    def rate(pod: str, codes: str = "") -> float:
        value = prometheus.value(f'sum(rate({REQUESTS_TOTAL}{{pod="{pod}"{codes}}}[{window}]))')
        assert value and value > 0, (pod, codes)
        return value
    assert values[b.pod] == pytest.approx(rate(b.pod), rel=0.05)  # all of b's are served
    everything = rate(a.pod)
    served = rate(a.pod, ',code!~"4.."')
    assert values[a.pod] == pytest.approx(served, rel=0.05), values
    # a's 401/429 (40 % of its traffic) are not load: the HPA sees about 6 of its 10.
    assert values[a.pod] / everything == pytest.approx(1 - REFUSED_A, abs=0.1), values


def test_queue_length_is_each_pods_queue(
        prometheus: PrometheusServer, rules: list[Rule],
        gateways: tuple[str, GatewayStandIn, GatewayStandIn]) -> None:
    namespace, a, b = gateways
    assert per_pod_values(prometheus, rules, QUEUE_LENGTH.hpa_metric, namespace,
                          [a.pod, b.pod]) == {a.pod: 3.0, b.pod: 0.0}
    assert per_pod_values(prometheus, rules, QUEUE_LENGTH.hpa_metric, namespace,
                          [a.pod]) == {a.pod: 3.0}


def test_kv_cache_utilization_is_a_percentage(
        prometheus: PrometheusServer, rules: list[Rule],
        gateways: tuple[str, GatewayStandIn, GatewayStandIn]) -> None:
    namespace, a, b = gateways
    values = per_pod_values(prometheus, rules, KV_CACHE_UTILIZATION.hpa_metric, namespace,
                            [a.pod, b.pod])
    assert values == {a.pod: pytest.approx(42.0), b.pod: pytest.approx(90.0)}


# --- device memory --------------------------------------------------------------------------

MODEL_NS = "e2e-rules-gpu"
PODS = {"chat-gpu-a": (18000.0, 6000.0), "chat-gpu-b": (12000.0, 12000.0)}  # used, free MiB
EXPECTED = {pod: pytest.approx(100 * used / (used + free)) for pod, (used, free) in PODS.items()}


@pytest.fixture
def fresh_prometheus() -> Iterator[PrometheusServer]:
    """A Prometheus of the test's own: adapter discovery looks back minutes, so each way of
    scraping the exporters gets a server that has seen no other."""
    reason = binary_missing_reason()
    if reason and in_ci():
        pytest.fail(reason, pytrace=False)
    if reason:
        pytest.skip(reason)
    with PrometheusServer() as server:
        yield server


def _dcgm(server: PrometheusServer, stack: ExitStack, honor_labels: bool) -> None:
    dcgm = stack.enter_context(DcgmExporter())
    for gpu, (pod, (used, free)) in enumerate(PODS.items()):
        dcgm.set_gpu(gpu, MODEL_NS, pod, used_mib=used, free_mib=free)
    # The exporter's own pod, as a ServiceMonitor's relabelling sets it on the target.
    server.add_target("dcgm", dcgm.address,
                      {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-7xk2p"},
                      honor_labels=honor_labels)


def _npu(server: PrometheusServer, stack: ExitStack, honor_labels: bool) -> None:
    npu = stack.enter_context(NpuExporter())
    for chip, (pod, (used, free)) in enumerate(PODS.items()):
        npu.set_chip(chip, MODEL_NS, pod, used_mb=used, total_mb=used + free)
    server.add_target("npu", npu.address,
                      {"namespace": "mindx-dl", "pod": "npu-exporter-4hq8d"},
                      honor_labels=honor_labels)


SCRAPES: dict[str, Callable[[PrometheusServer, ExitStack], None]] = {
    "dcgm-honorLabels": lambda s, st: _dcgm(s, st, honor_labels=True),
    "dcgm-exported_pod": lambda s, st: _dcgm(s, st, honor_labels=False),
    "npu-honorLabels": lambda s, st: _npu(s, st, honor_labels=True),
    "npu-exported_namespace": lambda s, st: _npu(s, st, honor_labels=False),
}


@pytest.mark.parametrize("scrape", list(SCRAPES))
def test_device_memory_utilization_per_pod(
        scrape: str, fresh_prometheus: PrometheusServer, rules: list[Rule]) -> None:
    with ExitStack() as stack:
        SCRAPES[scrape](fresh_prometheus, stack)
        fresh_prometheus.wait_for_series("up == 1", timeout=SCRAPED)
        served = discover(fresh_prometheus, rules)
        metric = ACCELERATOR_MEMORY_UTILIZATION.hpa_metric
        assert metric in served, f"{scrape}: no rule serves {metric}: {sorted(served)}"
        values = per_pod_values(fresh_prometheus, rules, metric, MODEL_NS, list(PODS))
        assert values == EXPECTED, f"{scrape}: {served[metric].rule}"
        assert all(not math.isnan(v) for v in values.values())


def test_prometheus_refuses_no_shipped_query(rules: list[Rule],
                                             prometheus: PrometheusServer) -> None:
    """Every rule's query, filled in as the adapter fills it, parses and runs."""
    for rule in rules:
        series = str(rule.raw["name"]["matches"]).strip("^$")
        query = rule.query(series, "e2e-rules-none", ["a", "b"])
        try:
            prometheus.query(query)
        except PrometheusError as exc:
            pytest.fail(f"{rule}: {query}: {exc}")
