"""The plan as GLMService status shows it (status.plan)."""

from __future__ import annotations

from glm_operator.api.glmservice import GLMService
from glm_operator.api.glmservice_status import PlanSummary
from glm_operator.api.modelversion import ModelVersion
from glm_operator.planning.from_api import facts_source
from glm_operator.planning.planner import Plan


def plan_summary(
    plan: Plan,
    service: GLMService | None = None,
    model_version_name: str | None = None,
    model_version: ModelVersion | None = None,
) -> PlanSummary:
    """status.plan for `plan`: the planner's own summary plus where the facts came from.

    `service` is accepted for symmetry with the other builders (and future per-service
    fields); the summary itself depends only on the plan and the ModelVersion.
    """
    del service
    summary = PlanSummary.model_validate(plan.summary())
    name = model_version_name or (model_version.metadata.name if model_version else None)
    source = facts_source(model_version) if model_version is not None else None
    return summary.model_copy(update={"model_version": name, "facts_source": source})
