"""Object names and labels shared by every child of a GLMService.

Names are DNS-1123 labels of at most 63 characters: when the natural name is longer, it is
cut and a short hash of the full name is appended, so two long names never collide.
"""

from __future__ import annotations

import hashlib
import re

# Re-exported: the renderers take their label keys from here.
from glm_operator.wellknown import COMPONENT_LABEL as COMPONENT_LABEL
from glm_operator.wellknown import MANAGED_BY as MANAGED_BY
from glm_operator.wellknown import MODEL_VERSION_LABEL as MODEL_VERSION_LABEL
from glm_operator.wellknown import POOL_LABEL as POOL_LABEL
from glm_operator.wellknown import SERVICE_LABEL as SERVICE_LABEL
from glm_operator.wellknown import VERSION_LABEL as VERSION_LABEL

MAX_NAME = 63
_INVALID = re.compile(r"[^a-z0-9-]+")


def dns_name(*parts: str, limit: int = MAX_NAME) -> str:
    """Join parts into a valid name, hashing the tail when it would exceed `limit`."""
    full = _INVALID.sub("-", "-".join(p for p in parts if p).lower()).strip("-")
    if len(full) <= limit:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    return f"{full[: limit - 9].rstrip('-')}-{digest}"


def label_value(value: str) -> str:
    """Label values are also capped at 63 characters."""
    return dns_name(value) if len(value) > MAX_NAME else value


def common_labels(service: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "glm-operator-model",
        "app.kubernetes.io/instance": label_value(service),
        COMPONENT_LABEL: component,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        SERVICE_LABEL: label_value(service),
    }


def pool_selector(service: str, version: str, pool: str) -> dict[str, str]:
    """The selector of one pool's pods: always service and version, so two services never mix."""
    return {SERVICE_LABEL: label_value(service), VERSION_LABEL: label_value(version),
            POOL_LABEL: pool}



# A request carrying this header goes to the named ModelVersion, whatever the weights (Istio).
VERSION_HEADER = "x-glm-version"
