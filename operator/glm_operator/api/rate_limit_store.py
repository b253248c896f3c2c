"""Where the gateways of one GLMService keep the rate-limit buckets they share: a Redis.

A cluster setting, not a model's: since v1alpha2 it is the operator's config
(`rateLimitStore`, Helm value `config.rateLimitStore`); a v1alpha1 GLMService
still carries one under `spec.gateway.rateLimit.store`, which the operator honours for that
service (conversion keeps it in an annotation) and reports as deprecated.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Literal

from pydantic import Field, model_validator

from glm_operator.api import rules
from glm_operator.api.base import Duration, SecretName, SpecModel
from glm_operator.wellknown import CONVERSION_STASH_ANNOTATION

_PORT = r"([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
REDIS_ADDRESS_PATTERN = (
    r"^(\[[0-9a-fA-F:.]+\]|[a-zA-Z0-9]([-a-zA-Z0-9.]*[a-zA-Z0-9])?):" + _PORT + "$"
)
# The pod's own loopback: a store there is the pod's alone, never shared by the service.
_LOOPBACK_PREFIXES = ("localhost:", "127.", "[::1]:")
MAX_STORE_TIMEOUT = "1s"


class SecretKeyRef(SpecModel):
    """One key of a Secret in the GLMService's namespace."""

    name: SecretName
    key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")


class RedisStore(SpecModel):
    """A Redis (standalone, or a primary behind one address) every gateway pod can reach."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": " && ".join(f"!self.address.startsWith('{p}')"
                                        for p in _LOOPBACK_PREFIXES),
                    "message": "the rate-limit store's redis.address is a loopback address: "
                    "each pod would count alone; give a Service name or address all the "
                    "gateway pods reach",
                    "fieldPath": ".address",
                }
            ]
        }
    }

    address: str = Field(
        max_length=260,
        pattern=REDIS_ADDRESS_PATTERN,
        description="host:port, e.g. redis.cache.svc:6379 ([v6]:port for an IPv6 address).",
    )
    tls: bool = Field(
        default=False,
        description="Connect with TLS; the server certificate must verify against the system "
        "CAs of the operator image.",
    )
    password_secret: SecretKeyRef | None = Field(
        default=None,
        description="The Redis password (AUTH): a Secret key, given to the gateway as an "
        "environment variable from the Secret, never in the pod spec.",
    )



class RateLimitStore(SpecModel):
    """Where the gateways of one GLMService keep the buckets they share."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "duration(self.timeout) > duration('0s') && "
                    f"duration(self.timeout) <= duration('{MAX_STORE_TIMEOUT}')",
                    "message": "the rate-limit store's timeout must be above 0 and at most "
                    f"{MAX_STORE_TIMEOUT} (every request waits for it)",
                    "fieldPath": ".timeout",
                }
            ]
        }
    }

    redis: RedisStore = Field(description="The Redis that holds every replica's buckets.")
    on_unavailable: Literal["Allow", "Deny"] = Field(
        default="Allow",
        description="When Redis does not answer within `timeout`: Allow counts in each pod's "
        "own buckets meanwhile (the limit then holds per pod, up to limit x ready pods for "
        "the service); Deny answers 503 with Retry-After. Redis is asked again a second "
        "later.",
    )
    timeout: Duration = Field(
        default="50ms",
        description="How long a request waits for Redis before `onUnavailable` applies.",
    )

    @model_validator(mode="after")
    def _rules(self) -> RateLimitStore:
        """Its CEL rules (loopback, timeout), evaluated here too (api/rules.py): in the
        operator's config no API server checks them."""
        rules.check(self, "rateLimitStore")
        return self

def service_store(annotations: Mapping[str, str] | None, rate_limited: bool,
                  cluster: RateLimitStore | None) -> RateLimitStore | None:
    """The store a rate-limited service's gateways share: the one its v1alpha1 spec named
    (kept by conversion in the stash annotation; deprecated), else the cluster's (operator
    config), else none (each pod counts alone)."""
    if not rate_limited:
        return None
    stash = (annotations or {}).get(CONVERSION_STASH_ANNOTATION)
    if stash:
        try:
            legacy = json.loads(stash).get("rateLimitStore")
            return cluster if legacy is None else RateLimitStore.model_validate(legacy)
        except ValueError:  # a hand-edited stash: the cluster's store still holds
            return cluster
    return cluster
