"""The real CRDs an inference gateway reads, Established before a test that needs them.

InferencePool (inference.networking.k8s.io/v1), InferenceObjective and InferenceModelRewrite
from the Gateway API Inference Extension's module at the `[epp]` pin, HTTPRoute from
sigs.k8s.io/gateway-api at `[gateway_api]`, each cached by the toolchain (components `inference_extension`,
`gateway_api`). Every cluster installs them at `up` (e2e/cluster.py THIRD_PARTY_CRDS); the
fixture applies them again (server-side: a no-op when they are there) for a kind cluster or
one a test removed them from, and waits until they are Established.
"""

from __future__ import annotations

import pytest
from glm_operator.render.inference_pool import INFERENCE_GATEWAY_CRDS

from e2e import toolchain
from e2e.kubectl import Kubectl

FILES = (("inference_extension", "inferencepools.yaml"),
         ("inference_extension", "inferenceobjectives.yaml"),
         # Not required by the operator, but watched by a pool's picker where it is served
         # (v1.5.0): installed so the pickers run on their rendered Role with it present.
         ("inference_extension", "inferencemodelrewrites.yaml"),
         ("gateway_api", "httproutes.yaml"))
FIELD_MANAGER = "glm-e2e-cluster"  # the manager of the cluster's other third-party CRDs


def install(kubectl: Kubectl) -> list[str]:
    """Install (or keep) the CRDs and wait until the operator's three are Established."""
    paths = [toolchain.ensure(component) / name for component, name in FILES]
    kubectl.apply_files(paths, field_manager=FIELD_MANAGER)
    kubectl("wait", "--for=condition=Established", "--timeout=60s",
            *[f"crd/{name}" for name in INFERENCE_GATEWAY_CRDS])
    return list(INFERENCE_GATEWAY_CRDS)


@pytest.fixture(scope="module")
def inference_crds(kubectl: Kubectl) -> list[str]:
    return install(kubectl)
