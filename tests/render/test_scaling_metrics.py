"""The catalogue of autoscaling signals: one entry per target field, rules that agree with it."""

from __future__ import annotations

import re

import pytest
from glm_operator.api.glmservice import Autoscaling, AutoscalingTargets
from glm_operator.gateway import metrics as gateway_metrics
from glm_operator.render.autoscaling import hpa_metrics
from glm_operator.render.scaling_metrics import (
    ACCELERATOR_MEMORY_UTILIZATION,
    BY_TARGET_FIELD,
    KV_CACHE_UTILIZATION,
    QUEUE_LENGTH,
    REJECTED_CODES,
    REQUESTS_PER_SECOND,
    SIGNALS,
    ScalingSignal,
    adapter_config,
    adapter_query,
)

TEMPLATE_FIELDS = ("<<.LabelMatchers>>", "<<.GroupBy>>")


def balanced(query: str) -> bool:
    pairs = {")": "(", "}": "{", "]": "["}
    stack: list[str] = []
    for char in re.sub(r'"(?:\\.|[^"\\])*"', '""', query):  # skip string literals
        if char in "({[":
            stack.append(char)
        elif char in pairs and (not stack or stack.pop() != pairs[char]):
            return False
    return not stack


def test_one_entry_per_target_field() -> None:
    fields = {info.alias for info in AutoscalingTargets.model_fields.values()}
    assert set(BY_TARGET_FIELD) == fields
    assert len({s.hpa_metric for s in SIGNALS}) == len(SIGNALS)


def test_gateway_signals_read_the_gateways_own_series() -> None:
    assert REQUESTS_PER_SECOND.series == gateway_metrics.REQUESTS_TOTAL
    assert QUEUE_LENGTH.series == gateway_metrics.REQUESTS_QUEUED
    assert KV_CACHE_UTILIZATION.series == gateway_metrics.KV_CACHE_USAGE_RATIO
    assert KV_CACHE_UTILIZATION.hpa_metric == "glm_kv_cache_utilization_percent"


@pytest.mark.parametrize("signal", SIGNALS, ids=lambda s: s.target_field)
def test_rules_are_well_formed(signal: ScalingSignal) -> None:
    assert signal.adapter_rule() == signal.adapter_rules()[0]
    assert signal.adapter_rule()["seriesQuery"].startswith(signal.series + "{")
    for rule in signal.adapter_rules():
        assert rule["name"]["as"] == signal.hpa_metric
        series = rule["name"]["matches"].strip("^$")
        assert rule["seriesQuery"].startswith(series + "{")
        overrides = rule["resources"]["overrides"]
        assert sorted(o["resource"] for o in overrides.values()) == ["namespace", "pod"]
        for label in overrides:  # the series must carry the labels the rule maps
            assert f'{label}!=""' in rule["seriesQuery"]
        query = rule["metricsQuery"]
        assert all(field in query for field in TEMPLATE_FIELDS), query
        expanded = adapter_query(rule, "models", ["a", "b"])
        assert "<<" not in expanded and balanced(expanded), expanded
        pod_label = next(k for k, v in overrides.items() if v["resource"] == "pod")
        assert f'{pod_label}=~"a|b"' in expanded and f") by ({pod_label})" in expanded


@pytest.mark.parametrize("code,rejected", [
    ("200", False), ("499", False), ("500", False), ("503", False),
    ("400", True), ("401", True), ("413", True), ("429", True), ("498", True),
])
def test_requests_per_second_counts_served_requests_only(code: str, rejected: bool) -> None:
    # Prometheus anchors label regexes: fullmatch is what it does.
    assert bool(re.fullmatch(REJECTED_CODES, code)) is rejected
    assert f'code!~"{REJECTED_CODES}"' in REQUESTS_PER_SECOND.adapter_rule()["metricsQuery"]
    assert f'code!~"{REJECTED_CODES}"' in REQUESTS_PER_SECOND.pool_query("m", "s", "v", "main")


def test_kv_cache_rule_is_a_percentage_of_the_ratio() -> None:
    assert KV_CACHE_UTILIZATION.adapter_rule()["metricsQuery"] == (
        "100 * max(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)")


def test_device_memory_rules_cover_every_exporter_and_the_renamed_labels() -> None:
    rules = ACCELERATOR_MEMORY_UTILIZATION.adapter_rules()
    assert [r["seriesQuery"] for r in rules] == [
        'DCGM_FI_DEV_FB_USED{namespace!="",pod!=""}',
        # Scraped without honorLabels: the workload's labels are renamed. prometheus-adapter
        # keeps the last rule that found series, so this variant must follow the plain one.
        'DCGM_FI_DEV_FB_USED{exported_namespace!="",exported_pod!=""}',
        'npu_chip_info_hbm_used_memory{namespace!="",pod_name!=""}',
        'npu_chip_info_hbm_used_memory{exported_namespace!="",pod_name!=""}',
    ]
    assert rules[1]["resources"]["overrides"] == {
        "exported_namespace": {"resource": "namespace"},
        "exported_pod": {"resource": "pod"}}
    assert rules[2]["resources"]["overrides"]["pod_name"] == {"resource": "pod"}
    assert "DCGM_FI_DEV_FB_FREE{<<.LabelMatchers>>}" in rules[0]["metricsQuery"]
    assert "npu_chip_info_hbm_total_memory{<<.LabelMatchers>>}" in rules[2]["metricsQuery"]


@pytest.mark.parametrize("signal", SIGNALS, ids=lambda s: s.target_field)
def test_pool_query_selects_one_pool_and_sums(signal: ScalingSignal) -> None:
    query = signal.pool_query("models", 'we"ird', "glm4-v2", "long-context")
    assert query.startswith("sum(") and balanced(query), query
    assert ('namespace="models",service="we\\"ird",model_version="glm4-v2",'
            'pool="long-context"') in query
    assert "<pool>" not in query


def test_device_memory_pool_query_joins_the_pools_gateways() -> None:
    query = ACCELERATOR_MEMORY_UTILIZATION.pool_query("m", "s", "v", "main")
    assert f"and on (namespace, pod) {gateway_metrics.READY}{{" in query
    assert 'label_replace' in query and '"exported_pod"' in query and '"pod_name"' in query


def test_adapter_config_lists_every_rule_once() -> None:
    rules = adapter_config()["rules"]
    assert len(rules) == sum(len(s.rules) for s in SIGNALS)
    assert {r["name"]["as"] for r in rules} == {s.hpa_metric for s in SIGNALS}


def test_hpa_names_the_catalogue_metrics_with_their_targets() -> None:
    autoscaling = Autoscaling.model_validate({
        "maxReplicas": 4,
        "targets": {"kvCacheUtilization": 70, "requestsPerSecond": 0.5,
                    "acceleratorMemoryUtilization": 95}})
    metrics = {m["pods"]["metric"]["name"]: m["pods"]["target"]["averageValue"]
               for m in hpa_metrics(autoscaling)}
    assert metrics == {"glm_kv_cache_utilization_percent": "70",
                       "glm_gateway_requests_per_second": "500m",
                       "glm_accelerator_memory_utilization_percent": "95"}
