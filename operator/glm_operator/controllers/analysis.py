"""The canary's analysis: the Prometheus queries of a step that is due for a check (I/O).

What to ask and how to judge the answers are pure (glm_operator/analysis/); this module
only decides whether a check is due, asks, and hands the verdict to the decision.
"""

from __future__ import annotations

from datetime import datetime

from glm_operator.analysis.canary import canary_queries, judge, unavailable
from glm_operator.analysis.prometheus import PrometheusError, query_scalar
from glm_operator.api import AnalysisResult, GLMService
from glm_operator.config import OperatorConfig
from glm_operator.decide.rollout import analysis_window, gates
from glm_operator.wellknown import PROMOTE_ANNOTATION


def canary_analysis(config: OperatorConfig, service: GLMService,
                    now: datetime) -> AnalysisResult | None:
    """Query Prometheus when the canary's current step is due for a check, else None."""
    if service.status.rollout is None or service.status.rollout.strategy != "canary":
        return None
    policy, status = service.spec.rollout, service.status
    window = analysis_window(status.rollout, policy, status.stable_model_version,
                             service.spec.model_version, now)
    if window is None:
        return None
    url = config.prometheus.url
    if not url:
        return unavailable("no Prometheus to analyse the canary: set prometheus.url in the "
                           "operator config (helm value prometheus.url); promote with the "
                           f"{PROMOTE_ANNOTATION} annotation meanwhile", window, now)
    queries = canary_queries(service.metadata.namespace or "", service.metadata.name or "",
                             service.spec.model_version, status.stable_model_version, window,
                             gates(policy).compare_to_stable)
    try:
        values = {key: query_scalar(url, promql, config.prometheus.timeout_seconds)
                  for key, promql in queries.all().items()}
    except PrometheusError as exc:
        return unavailable(f"Prometheus did not answer, holding the step: {exc}"[:500],
                           window, now)
    return judge(gates(policy), values, window, now)
