"""The autoscaling signals: one entry per `spec.autoscaling.targets` field.

Each entry ties together what must agree for an autoscaler to see a number: the API field,
the per-pod metric the HPA asks the custom metrics API for, the Prometheus series it is
computed from, the prometheus-adapter rules that compute it, and the same computation summed
over one pool (for autoscalers that query Prometheus themselves, such as KEDA). The HPA
renderer, the shipped adapter rules file and the docs all read this module, so the names
cannot drift apart. Gateway series names are imported from the gateway, never retyped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from glm_operator.gateway.metrics import (
    KV_CACHE_USAGE_RATIO,
    READY,
    REQUESTS_QUEUED,
    REQUESTS_TOTAL,
)

# The device exporters' series (not ours: DCGM exporter on NVIDIA, npu-exporter on Ascend).
DCGM_FB_USED = "DCGM_FI_DEV_FB_USED"  # MiB
DCGM_FB_FREE = "DCGM_FI_DEV_FB_FREE"  # MiB
NPU_HBM_USED = "npu_chip_info_hbm_used_memory"  # MiB
NPU_HBM_TOTAL = "npu_chip_info_hbm_total_memory"  # MiB

# A rejection (400 bad request, 401, 413, 429...) costs the engine nothing, so it is not load.
# 499 (the client hung up) is kept: the engine was working on it. RE2 has no lookahead, hence
# the spelled-out ranges.
REJECTED_CODES = "4([0-8].|9[0-8])"
RATE_WINDOW = "2m"
POOL_SELECTOR = "<pool>"  # placeholder in per_pod_template


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class AdapterRule:
    """One prometheus-adapter rule: which series to discover, which of their labels name the
    pod and its namespace, and the query (a Go template over `<<.Series>>`,
    `<<.LabelMatchers>>` and `<<.GroupBy>>`)."""

    series: str
    metrics_query: str
    namespace_label: str = "namespace"
    pod_label: str = "pod"
    note: str = ""  # where the series comes from; written above the rule in the shipped file

    def as_dict(self, hpa_metric: str) -> dict[str, Any]:
        return {
            "seriesQuery": f'{self.series}{{{self.namespace_label}!="",{self.pod_label}!=""}}',
            "resources": {"overrides": {
                self.namespace_label: {"resource": "namespace"},
                self.pod_label: {"resource": "pod"},
            }},
            "name": {"matches": f"^{self.series}$", "as": hpa_metric},
            "metricsQuery": self.metrics_query,
        }


@dataclass(frozen=True)
class ScalingSignal:
    """One `spec.autoscaling.targets` field and how its per-pod value is computed."""

    target_field: str  # the API name, e.g. "requestsPerSecond"
    hpa_metric: str  # the per-pod custom metric the HPA asks for
    series: str  # the Prometheus series the (first) adapter rule discovers it from
    meaning: str  # one line for docs: what the number is
    rules: tuple[AdapterRule, ...]
    # PromQL of the per-pod value, grouped by namespace and pod, for the pods whose gateway
    # series match POOL_SELECTOR (replaced by the pool's label matchers): pool_query sums it.
    per_pod_template: str

    def adapter_rules(self) -> list[dict[str, Any]]:
        """Every adapter rule for this metric. When several rules find series for one metric
        name, prometheus-adapter keeps the last one: later rules are the more specific ones."""
        return [rule.as_dict(self.hpa_metric) for rule in self.rules]

    def adapter_rule(self) -> dict[str, Any]:
        """The first (for gateway signals, the only) adapter rule."""
        return self.rules[0].as_dict(self.hpa_metric)

    def pool_query(self, namespace: str, service: str, model_version: str, pool: str) -> str:
        """PromQL summing this signal over one pool's pods. With KEDA's metricType
        AverageValue (the sum divided by the replicas) the per-pod target is the HPA's."""
        selector = (f"namespace={_quote(namespace)},service={_quote(service)},"
                    f"model_version={_quote(model_version)},pool={_quote(pool)}")
        return f"sum({self.per_pod_template.replace(POOL_SELECTOR, selector)})"


def _gateway_rule(series: str, query: str) -> AdapterRule:
    return AdapterRule(series=series, metrics_query=query,
                       note="the gateway sidecar's own series")


REQUESTS_PER_SECOND = ScalingSignal(
    target_field="requestsPerSecond",
    hpa_metric="glm_gateway_requests_per_second",
    series=REQUESTS_TOTAL,
    meaning="requests served per second (rejections such as 401 and 429 are not counted), "
            f"over {RATE_WINDOW}",
    rules=(_gateway_rule(
        REQUESTS_TOTAL,
        f'sum(rate(<<.Series>>{{<<.LabelMatchers>>,code!~"{REJECTED_CODES}"}}[{RATE_WINDOW}])) '
        "by (<<.GroupBy>>)"),),
    per_pod_template=(f"sum by (namespace, pod) (rate({REQUESTS_TOTAL}{{{POOL_SELECTOR},"
                      f'code!~"{REJECTED_CODES}"}}[{RATE_WINDOW}]))'),
)

QUEUE_LENGTH = ScalingSignal(
    target_field="queueLength",
    hpa_metric="glm_gateway_requests_queued",
    series=REQUESTS_QUEUED,
    meaning="requests waiting beyond the engine's slots (or held while the long-context pool "
            "wakes)",
    rules=(_gateway_rule(REQUESTS_QUEUED,
                         "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)"),),
    per_pod_template=f"sum by (namespace, pod) ({REQUESTS_QUEUED}{{{POOL_SELECTOR}}})",
)

KV_CACHE_UTILIZATION = ScalingSignal(
    target_field="kvCacheUtilization",
    hpa_metric="glm_kv_cache_utilization_percent",
    series=KV_CACHE_USAGE_RATIO,
    meaning="share of the engine's KV cache in use, percent (the same for every engine)",
    # max, not sum: one engine per pod, and a pod scraped twice must not read 200 %.
    rules=(_gateway_rule(KV_CACHE_USAGE_RATIO,
                         "100 * max(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)"),),
    per_pod_template=(f"100 * max by (namespace, pod) "
                      f"({KV_CACHE_USAGE_RATIO}{{{POOL_SELECTOR}}})"),
)


def _dcgm_query(used: str = "<<.Series>>") -> str:
    matchers = "{<<.LabelMatchers>>}"
    return (f"100 * sum({used}{matchers}) by (<<.GroupBy>>) / "
            f"(sum({used}{matchers}) by (<<.GroupBy>>) + "
            f"sum({DCGM_FB_FREE}{matchers}) by (<<.GroupBy>>))")


def _npu_query() -> str:
    return (f"100 * sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>) / "
            f"sum({NPU_HBM_TOTAL}{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)")


def _device_per_pod(used: str, total: str, namespace_label: str, pod_label: str) -> str:
    """Percent of device memory used per pod from one exporter's series, relabelled to
    namespace/pod so the variants combine."""
    by = f"{namespace_label}, {pod_label}"
    percent = f"(100 * sum by ({by}) ({used}) / sum by ({by}) ({total}))"
    if pod_label != "pod":
        percent = f'label_replace({percent}, "pod", "$1", "{pod_label}", "(.+)")'
    if namespace_label != "namespace":
        percent = f'label_replace({percent}, "namespace", "$1", "{namespace_label}", "(.+)")'
    return f"max by (namespace, pod) ({percent})"


def _device_memory_per_pod_template() -> str:
    variants = [
        _device_per_pod(DCGM_FB_USED, f"({DCGM_FB_USED} + {DCGM_FB_FREE})", "namespace", "pod"),
        _device_per_pod(DCGM_FB_USED, f"({DCGM_FB_USED} + {DCGM_FB_FREE})",
                        "exported_namespace", "exported_pod"),
        _device_per_pod(NPU_HBM_USED, NPU_HBM_TOTAL, "namespace", "pod_name"),
        _device_per_pod(NPU_HBM_USED, NPU_HBM_TOTAL, "exported_namespace", "pod_name"),
    ]
    # Device series carry no service labels: keep the pods whose gateway says they belong to
    # the pool.
    return f"({' or '.join(variants)}) and on (namespace, pod) {READY}{{{POOL_SELECTOR}}}"


ACCELERATOR_MEMORY_UTILIZATION = ScalingSignal(
    target_field="acceleratorMemoryUtilization",
    hpa_metric="glm_accelerator_memory_utilization_percent",
    series=DCGM_FB_USED,
    meaning="device memory in use, percent (a guard: engines allocate their KV cache up "
            "front, so it hardly moves with load)",
    rules=(
        AdapterRule(series=DCGM_FB_USED, metrics_query=_dcgm_query(),
                    note="NVIDIA dcgm-exporter with Kubernetes pod mapping, scraped with "
                         "honorLabels (the pod's own namespace/pod labels)"),
        AdapterRule(series=DCGM_FB_USED, metrics_query=_dcgm_query(),
                    namespace_label="exported_namespace", pod_label="exported_pod",
                    note="NVIDIA dcgm-exporter scraped without honorLabels: Prometheus renames "
                         "the pod's labels to exported_namespace/exported_pod (this rule comes "
                         "last so it wins when both find series)"),
        AdapterRule(series=NPU_HBM_USED, metrics_query=_npu_query(), pod_label="pod_name",
                    note="Huawei Ascend npu-exporter (MindX DL), which names the pod pod_name"),
        AdapterRule(series=NPU_HBM_USED, metrics_query=_npu_query(),
                    namespace_label="exported_namespace", pod_label="pod_name",
                    note="npu-exporter scraped without honorLabels: Prometheus renames its "
                         "namespace label to exported_namespace (pod_name does not clash)"),
    ),
    per_pod_template=_device_memory_per_pod_template(),
)

# In the order the HPA lists them.
SIGNALS: tuple[ScalingSignal, ...] = (
    REQUESTS_PER_SECOND,
    QUEUE_LENGTH,
    KV_CACHE_UTILIZATION,
    ACCELERATOR_MEMORY_UTILIZATION,
)
BY_TARGET_FIELD: dict[str, ScalingSignal] = {s.target_field: s for s in SIGNALS}


def adapter_query(rule: dict[str, Any], namespace: str, pods: list[str]) -> str:
    """The PromQL prometheus-adapter sends for one rule when the HPA asks for `pods`: its
    template expansion, for tests and for checking a rule by hand."""
    series = rule["name"]["matches"].strip("^$")
    labels = {resource["resource"]: label
              for label, resource in rule["resources"]["overrides"].items()}
    pod_regex = "|".join(pods)
    matchers = (f"{labels['namespace']}={_quote(namespace)},"
                f"{labels['pod']}=~{_quote(pod_regex)}")
    query: str = rule["metricsQuery"]
    return (query.replace("<<.Series>>", series).replace("<<.LabelMatchers>>", matchers)
            .replace("<<.GroupBy>>", labels["pod"]))


def adapter_config() -> dict[str, Any]:
    """A prometheus-adapter config file (its `--config`; the chart's `rules.existing`)."""
    return {"rules": [rule for signal in SIGNALS for rule in signal.adapter_rules()]}


def _commented_rules(indent: str) -> list[str]:
    """The rules as YAML list items, each under a comment saying what it serves."""
    lines = []
    for signal in SIGNALS:
        lines.append(f"{indent}# {signal.target_field} -> {signal.hpa_metric}: {signal.meaning}")
        for rule in signal.rules:
            lines.append(f"{indent}# from {rule.note}")
            item = yaml.safe_dump([rule.as_dict(signal.hpa_metric)], sort_keys=False, width=100)
            lines += [indent + line for line in item.splitlines()]
    return lines


ADAPTER_RULES_FILE = "charts/glm-operator/files/prometheus-adapter-rules.yaml"
ADAPTER_VALUES_FILE = "charts/glm-operator/files/prometheus-adapter-values.yaml"


def adapter_files(generated_note: str) -> dict[str, str]:
    """The shipped prometheus-adapter files, by path under the repository root: its config
    file (the chart's ConfigMap for `rules.existing`) and a values file for the
    prometheus-community/prometheus-adapter chart (`rules.custom`)."""
    config = [
        generated_note.rstrip("\n"),
        "# prometheus-adapter's config file: the custom metrics GLMService HPAs ask for",
        "# (docs/autoscaling.md). The glm-operator chart ships it as a ConfigMap",
        "# (metrics.prometheusAdapterRules) for the prometheus-adapter chart's rules.existing.",
        "# The gateways must be scraped with namespace and pod labels (the ServiceMonitor the",
        "# operator renders does this). When several rules find series for one metric,",
        "# prometheus-adapter keeps the last: the exported_* variants come after the plain ones.",
        "rules:",
        *_commented_rules(""),
    ]
    values = [
        generated_note.rstrip("\n"),
        "# Values for the prometheus-community/prometheus-adapter chart: the custom metrics the",
        "# GLMService HPAs ask for (docs/autoscaling.md), the same rules as",
        "# prometheus-adapter-rules.yaml. Install the adapter with",
        "#   helm install prometheus-adapter prometheus-community/prometheus-adapter \\",
        "#     -n monitoring --set prometheus.url=http://prometheus-operated.monitoring.svc \\",
        "#     -f glm-operator/files/prometheus-adapter-values.yaml",
        "rules:",
        "  custom:",
        *_commented_rules("    "),
    ]
    return {ADAPTER_RULES_FILE: "\n".join(config) + "\n",
            ADAPTER_VALUES_FILE: "\n".join(values) + "\n"}
