"""What prometheus-adapter does with a `rules:` entry, step by step, against a real Prometheus.

The module proxy does not serve sigs.k8s.io/prometheus-adapter, so its rule handling is
followed here from its config reference (docs/config.md) and its code (pkg/naming):

1. Discovery: `seriesQuery` goes to /api/v1/series; every series found is a candidate.
2. Association: `resources.overrides` maps a series label to a Kubernetes resource
   (`resources.template` with `<<.Resource>>` does it by pattern). A series names a pod only
   if it carries the pod's label.
3. Naming: `name.matches` (a regex on the series name) and `name.as` (its replacement,
   `$1`-style) give the custom metric's name. When several rules name the same metric for
   pods, the adapter keeps ONE: the last rule (in file order) that discovered a series.
4. Querying: for the HPA's request (namespace NS, pods a and b), `metricsQuery` is a Go
   template with `<<` `>>` delimiters, filled with
     <<.Series>>         the discovered series name
     <<.LabelMatchers>>  namespace-label="NS",pod-label=~"a|b"   (="a" for one pod; the
                         catalogue's adapter_query writes =~"a", which selects the same)
     <<.GroupBy>>        the pod label
   and each result sample is matched to a pod by its pod label.

    rules = load_rules(path)
    values = per_pod_values(prometheus, rules, "glm_gateway_requests_queued", "ns", ["a", "b"])
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from glm_operator.render.scaling_metrics import adapter_query

from e2e.prometheus import PrometheusServer

TEMPLATE_FIELD = re.compile(r"<<\s*([^>]*?)\s*>>")
SUPPORTED_FIELDS = (".Series", ".LabelMatchers", ".GroupBy")


class RuleError(AssertionError):
    """A rule prometheus-adapter would refuse or that cannot serve the metric."""


@dataclass(frozen=True)
class Rule:
    index: int  # position in the file: a later rule wins for one metric name
    raw: dict[str, Any]

    def __str__(self) -> str:
        return f"rule #{self.index} ({self.raw.get('seriesQuery')})"

    def label_for(self, resource: str) -> str:
        """The series label naming `resource` ("pod", "namespace")."""
        resources = self.raw.get("resources", {})
        for label, target in (resources.get("overrides") or {}).items():
            if (target.get("group", "") == "" and
                    target.get("resource") in (resource, f"{resource}s")):
                return str(label)
        template = resources.get("template")
        if template:
            return str(template.replace("<<.Group>>", "").replace("<<.Resource>>", resource))
        raise RuleError(f"{self} maps no label to the {resource} resource")

    def metric_name(self, series: str) -> str | None:
        """The custom metric name the adapter gives `series`, None when `name.matches` does
        not match (the series is skipped)."""
        name = self.raw.get("name") or {}
        matches = name.get("matches") or ".*"
        found = re.search(matches, series)
        if found is None:
            return None
        replacement = name.get("as") or ("$1" if found.re.groups else "$0")
        # Go's regexp.Expand: $1 / ${1}; Python's: \g<1>.
        return str(found.expand(re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", replacement)))

    def query(self, series: str, namespace: str, pods: list[str]) -> str:
        template = str(self.raw["metricsQuery"])
        unknown = {f for f in TEMPLATE_FIELD.findall(template) if f not in SUPPORTED_FIELDS}
        if unknown:
            raise RuleError(f"{self} uses template fields this check does not model: {unknown}")
        if "overrides" not in self.raw.get("resources", {}):
            raise RuleError(f"{self}: only resources.overrides rules are modelled")
        rule = {**self.raw, "name": {**self.raw["name"], "matches": f"^{series}$"}}
        return adapter_query(rule, namespace, pods)


def load_rules(path: Path) -> list[Rule]:
    config = yaml.safe_load(path.read_text())
    rules = config.get("rules") if isinstance(config, dict) else None
    if not rules:
        raise RuleError(f"{path} has no `rules:` list")
    return [Rule(index, raw) for index, raw in enumerate(rules)]


@dataclass(frozen=True)
class Discovered:
    rule: Rule
    series: str  # the series name the query is built with


def discover(prometheus: PrometheusServer, rules: list[Rule]) -> dict[str, Discovered]:
    """custom metric name (for pods) -> the rule and series the adapter would serve it with,
    from the series Prometheus holds now."""
    served: dict[str, Discovered] = {}
    for rule in rules:
        pod_label, ns_label = rule.label_for("pod"), rule.label_for("namespace")
        for labels in prometheus.series(str(rule.raw["seriesQuery"])):
            if not labels.get(pod_label) or not labels.get(ns_label):
                continue  # not associated with a pod
            name = rule.metric_name(labels["__name__"])
            if name is not None:
                served[name] = Discovered(rule, labels["__name__"])  # the last rule wins
    return served


def per_pod_values(prometheus: PrometheusServer, rules: list[Rule], metric: str,
                   namespace: str, pods: list[str]) -> dict[str, float]:
    """What the adapter answers for `metric` of `pods`: pod name -> value (pods without a
    sample are left out, as the adapter leaves them out)."""
    served = discover(prometheus, rules)
    if metric not in served:
        raise RuleError(f"no rule serves {metric!r} for pods from the series Prometheus has; "
                        f"served: {sorted(served)}")
    found = served[metric]
    query = found.rule.query(found.series, namespace, pods)
    pod_label = found.rule.label_for("pod")
    values: dict[str, float] = {}
    for labels, value in prometheus.query(query):
        if labels.get(pod_label) in pods:
            values[labels[pod_label]] = value
    return values
