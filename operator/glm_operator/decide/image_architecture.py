"""Whether a version's pods have an image build for their nodes' architecture (pure).

Every pod is pinned to the architectures its profile's nodes and all its images share
(render/node_architecture.py). A pool left with none (the CANN image built for arm64 only on
a profile of x86 Atlas hosts; a mirror that copied the amd64 build of vllm-ascend only) would
get pods that no node can run: Pending forever, or `exec format error` on a mislabelled
node. Such a service is refused here as Planned=False, reason NoImageForNodeArchitecture,
before any pod is created, with the nodes' architectures, the image's builds and the fix.
Both pools are checked: the long-context pool may run on another profile. So is a
`kubernetes.io/arch` in spec.podOverrides.nodeSelector that the pin leaves out (the pod
would wait Pending for a node that both must match).
"""

from __future__ import annotations

from glm_operator.api import GLMService
from glm_operator.config import OperatorConfig
from glm_operator.planning.architectures import ARCH_LABEL
from glm_operator.planning.planner import Plan
from glm_operator.render.node_architecture import pool_architectures
from glm_operator.wellknown import LONG_CONTEXT_POOL, MAIN_POOL

REASON = "NoImageForNodeArchitecture"


def image_architecture_problem(service: GLMService, main: Plan, long_context: Plan | None,
                               config: OperatorConfig) -> tuple[str, str] | None:
    """(reason, message) when a pool's pods have no architecture in common with their
    images; None when every pool has at least one."""
    for pool, plan in ((MAIN_POOL, main), (LONG_CONTEXT_POOL, long_context)):
        if plan is None:
            continue
        fit = pool_architectures(service, plan, config)
        if fit.problem is not None:
            return (REASON, f"the {pool} pool's pods cannot run anywhere: {fit.problem}")
        overrides = service.spec.pod_overrides
        chosen = (overrides.node_selector or {}).get(ARCH_LABEL) if overrides else None
        if chosen is not None and chosen not in fit.architectures:
            return (REASON, f"the {pool} pool's pods cannot run anywhere: "
                    f"spec.podOverrides.nodeSelector asks for {ARCH_LABEL}={chosen}, but the "
                    f"nodes of accelerator profile {plan.profile.name} and the pods' images "
                    f"share {'/'.join(fit.architectures)} only: remove it from the "
                    f"nodeSelector (the operator pins {ARCH_LABEL} itself) or choose "
                    "another accelerator profile")
    return None
