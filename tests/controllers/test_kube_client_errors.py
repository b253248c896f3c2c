"""A connection the API server drops (it restarts) is a KubeError like any failed call, so
the reconcile that made it is retried soon (`retry_later`, controllers/reconcile.py), not
crashed into kopf's one-minute retry. Shown end to end by e2e/test_chaos.py."""

from __future__ import annotations

from typing import Any

import pytest
import urllib3
from glm_operator.kube.client import KubeClient, KubeError
from kubernetes import client as k8s


class _Refusing(k8s.ApiClient):  # type: ignore[misc]
    def __init__(self, error: Exception) -> None:
        self.error = error

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        raise self.error


@pytest.mark.parametrize("error", [
    urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError(104)),
    urllib3.exceptions.MaxRetryError(urllib3.HTTPConnectionPool("127.0.0.1"), "/api",
                                     reason=ConnectionRefusedError(111)),
    ConnectionRefusedError(111, "Connection refused"),
])
def test_unreachable_api_server_is_a_kube_error(error: Exception) -> None:
    kube = KubeClient(_Refusing(error))
    with pytest.raises(KubeError, match=r"cannot reach the API server .*deployments/d") as info:
        kube.apply({"apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": "d", "namespace": "n"}})
    assert info.value.status is None
