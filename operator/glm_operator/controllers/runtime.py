"""What every reconcile needs, in one object built at start-up (CNPG's ClusterReconciler).

kopf calls module functions, so one module-level holder keeps that object (`configure`
sets it, `runtime()` reads it); nothing else here is module state. The object holds the
API client, the operator config and profiles, the per-key queue, the wakeups, the
operator's own writes, what it remembers of optional children, the relist detector, the
sweeper, the Secret names and the latest kopf indexes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from glm_operator.config import OperatorConfig
from glm_operator.controllers.apply import OptionalChildren
from glm_operator.controllers.key_queue import KeyQueue
from glm_operator.controllers.own_writes import OwnWrites
from glm_operator.controllers.relists import RelistDetector, Sweeper
from glm_operator.controllers.scope import in_scope
from glm_operator.controllers.secrets import SecretNames
from glm_operator.controllers.wakeups import Wakeups
from glm_operator.kube.client import KubeClient
from glm_operator.planning.accelerators import AcceleratorProfile
from glm_operator.render.capabilities import capabilities_served
from glm_operator.render.service import Capabilities


@dataclass
class Runtime:
    kube: KubeClient
    config: OperatorConfig
    profiles: Mapping[str, AcceleratorProfile]
    wakeups: Wakeups
    sweeper: Sweeper
    queue: KeyQueue = field(default_factory=KeyQueue)
    own_writes: OwnWrites = field(default_factory=OwnWrites)
    optional: OptionalChildren = field(default_factory=OptionalChildren)
    relists: RelistDetector = field(default_factory=RelistDetector)
    # Which Secrets exist, by name (controllers/secrets.py fills it).
    secrets: SecretNames = field(default_factory=lambda: SecretNames(in_scope))
    # The kopf indexes, as the first handler saw them (live views), for the threads that
    # reconcile outside kopf's handlers (resync, wakeups, the sweep).
    indexes: dict[str, Any] = field(default_factory=dict)

    def capabilities(self) -> Capabilities:
        """Which optional CRDs are served, each cached for capabilityRecheckSeconds."""
        ttl = self.config.capability_recheck_seconds
        # The same value `glm-operator render --cluster-has` builds (render/capabilities.py).
        return capabilities_served(lambda crd: self.kube.crd_established(crd, ttl))

    def remember_indexes(self, indexes: Mapping[str, Any]) -> None:
        if not self.indexes and "glmservices" in indexes:
            self.indexes.update({k: v for k, v in indexes.items() if isinstance(v, kopf.Index)})

    def latest_indexes(self) -> dict[str, Any]:
        return dict(self.indexes)


_current: Runtime | None = None


def configure(runtime: Runtime) -> None:
    global _current
    _current = runtime


def runtime() -> Runtime:
    if _current is None:
        raise RuntimeError("the operator runtime is not configured (run `glm-operator run`)")
    return _current
