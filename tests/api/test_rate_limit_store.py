"""The rate-limit store in the operator's config (v1alpha2: a cluster setting): the same
rules a v1alpha1 GLMService's own store met at admission, applied when the config loads."""

from __future__ import annotations

from typing import Any

import pytest
from glm_operator.config import OperatorConfig
from pydantic import ValidationError


@pytest.mark.parametrize(("store", "says"), [
    ({"redis": {"address": "127.0.0.1:6379"}}, "rateLimitStore.redis.address: the rate-limit "
     "store's redis.address is a loopback address"),
    ({"redis": {"address": "localhost:6379"}}, "loopback address"),
    ({"redis": {"address": "redis:6379"}, "timeout": "5s"},
     "rateLimitStore.timeout: the rate-limit store's timeout must be above 0 and at most 1s"),
    ({"redis": {"address": "redis:70000"}}, "address"),
    ({"redis": {"address": "redis:6379"}, "onUnavailable": "Retry"}, "onUnavailable"),
    ({"redis": {"address": "redis:6379", "password": "hunter2"}}, "password"),
])
def test_a_store_the_gateways_could_not_share_is_refused_naming_the_field(
        store: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        OperatorConfig.model_validate({"rateLimitStore": store})


def test_a_reachable_store_loads_with_its_defaults() -> None:
    config = OperatorConfig.model_validate(
        {"rateLimitStore": {"redis": {"address": "redis.cache.svc:6379"}}})
    assert config.rate_limit_store is not None
    assert (config.rate_limit_store.on_unavailable, config.rate_limit_store.timeout) == (
        "Allow", "50ms")
