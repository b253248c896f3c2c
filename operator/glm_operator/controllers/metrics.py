"""The operator's own Prometheus metrics (served by `glm-operator run --metrics-port`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from glm_operator.api.glmservice import RolloutStrategy
from glm_operator.api.glmservice_status import FINISHED_PHASES

RECONCILES = Counter(
    "glm_operator_reconciles_total",
    "Reconciles by kind and result (ok, error, or coalesced: an event folded into a reconcile "
    "of the same object already waiting to start).", ["kind", "result"]
)
RECONCILE_SECONDS = Histogram(
    "glm_operator_reconcile_duration_seconds", "Time per reconcile, by kind.", ["kind"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
CHILD_WRITES = Counter(
    "glm_operator_child_writes_total", "Children applied or deleted, by kind and action.",
    ["kind", "action"],
)
CHILD_DRIFT = Counter(
    "glm_operator_child_drift_total",
    "Children written because they differed, by kind and reason: Missing, IntentChanged (the "
    "operator renders something else) or LiveChanged (someone else edited a field it sets).",
    ["kind", "reason"],
)
INDEX_GHOSTS = Counter(
    "glm_operator_index_ghosts_dropped_total",
    "Objects deleted while a watch was cut off (kopf listed their kind again and never saw "
    "them go), dropped from the operator's cache, by kind.", ["kind"],
)
MANAGED_OBJECTS = Gauge(
    "glm_operator_managed_objects", "Objects the operator manages, by kind.", ["kind"]
)
PLAN_FAILURES = Counter(
    "glm_operator_plan_failures_total", "Reconciles that could not plan, by reason.", ["reason"]
)
ROLLOUTS = Counter(
    "glm_operator_rollouts_total",
    "Finished version rollouts, by strategy and result (Succeeded, RolledBack, Aborted, Failed, "
    "Superseded).", ["strategy", "result"],
)
ANALYSIS_CHECKS = Counter(
    "glm_operator_canary_checks_total",
    "Canary analysis checks, by verdict (Passed, Failed, InsufficientTraffic, Unavailable).",
    ["verdict"],
)

# Label sets that start at 0 when the process starts, rather than at their first event. A
# rollback or a plan failure is rare: without its series, the dashboard's "Rollbacks (24h)"
# and "Plan failures (1h)" read "No data" (a Grafana user cannot tell that from a broken
# scrape) instead of 0, and increase() misses the first event (a series first seen at 1 has
# not increased), so the alerts on them would not fire for it. The panels keep their
# legends (`reason`), which `or vector(0)` in the query would lose.
# Rollout results as reconcile_service records them: the finished phases and Superseded.
ROLLOUT_RESULTS = (*sorted(str(phase) for phase in FINISHED_PHASES), "Superseded")
# The reasons of Planned=False (decide/versions.py), the only ones this counter counts.
PLAN_FAILURE_REASONS = ("Infeasible",)
for _strategy in RolloutStrategy:
    for _result in ROLLOUT_RESULTS:
        ROLLOUTS.labels(strategy=str(_strategy), result=_result)
for _reason in PLAN_FAILURE_REASONS:
    PLAN_FAILURES.labels(reason=_reason)
