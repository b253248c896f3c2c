"""Kubernetes Events about the operator's objects, built here and sent by KubeClient.create.

Written through our own client instead of kopf.event: kopf's posting needs the context of
its own handler tasks, which the resync and rollout-timer threads do not have, and an
Event lost there (a rollback, a promotion) is one the user needed.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

COMPONENT = "glm-operator"
MAX_MESSAGE = 1024
_INSTANCE = os.environ.get("POD_NAME") or socket.gethostname()


def event_for(involved: Mapping[str, Any], type_: str, reason: str, message: str,
              now: datetime | None = None) -> dict[str, Any]:
    meta = involved["metadata"]
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": involved["apiVersion"], "kind": involved["kind"],
            "name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": _INSTANCE,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
