"""The Secrets a GLMService names, and whether they exist (pure).

A pod that mounts a missing Secret (the API keys) or reads a key of one into its environment
(the rate-limit store's password) never starts: the kubelet retries, and the pod sits in
ContainerCreating or CreateContainerConfigError with the reason in an Event few people read.
The operator sees the Secrets' names through a metadata-only watch (controllers/secrets.py:
no Secret's data ever reaches it), and the decision here turns a missing one into condition
ResolvedRefs=False naming the Secret, the namespace and the fix.

Pods are still rendered while a Secret is missing: the kubelet starts them by itself as soon
as it exists (no operator round trip), a Secret deleted under a serving version must not take
its running pods down (they keep the keys they mounted), and the operator's view of Secrets
can lag the API server's, which is the one that decides.
"""

from __future__ import annotations

from dataclasses import dataclass

from glm_operator.api import GLMService
from glm_operator.config import OperatorConfig
from glm_operator.render.pod import rate_limit_store


@dataclass(frozen=True)
class SecretRef:
    """One Secret the service names: where, and what the pods need it for."""

    name: str
    field: str  # the spec field that names it
    purpose: str  # what the pods read from it
    create: str  # how to make one (kubectl create secret ... with the key it needs)


@dataclass(frozen=True)
class SecretsObserved:
    """What the operator's watch of Secret metadata says of the service's Secrets: `known`
    False while it cannot say (not listed yet, or not permitted); `present`: the names among
    them that exist in the service's namespace."""

    known: bool
    present: frozenset[str] = frozenset()


UNOBSERVED = SecretsObserved(known=False)


def secret_references(service: GLMService, config: OperatorConfig) -> list[SecretRef]:
    """Every Secret the service's pods read, in spec order."""
    namespace = service.metadata.namespace or "<namespace>"
    gateway = service.spec.gateway
    refs: list[SecretRef] = []
    if gateway.api_keys_secret:
        name = gateway.api_keys_secret
        refs.append(SecretRef(
            name, "spec.gateway.apiKeysSecret", "the API keys the gateway mounts",
            f"kubectl create secret generic {name} -n {namespace} --from-literal=key1=<key>"))
    store = rate_limit_store(service, config)
    password = store.redis.password_secret if store else None
    if password is not None:
        refs.append(SecretRef(
            password.name, "rateLimitStore.redis.passwordSecret (the operator's config)",
            f"the rate-limit store's password (key {password.key!r})",
            f"kubectl create secret generic {password.name} -n {namespace} "
            f"--from-literal={password.key}=<password>"))
    return refs


@dataclass(frozen=True)
class References:
    """The ResolvedRefs verdict: `ok` None while Secrets cannot be observed."""

    ok: bool | None
    reason: str
    message: str

    @property
    def problem(self) -> tuple[str, str] | None:
        """(reason, message) when a Secret is missing: Ready says it while nothing serves."""
        return (self.reason, self.message) if self.ok is False else None


def resolve_references(service: GLMService, observed: SecretsObserved,
                       config: OperatorConfig) -> References:
    refs = secret_references(service, config)
    namespace = service.metadata.namespace or ""
    if not refs:
        return References(True, "NoSecretReferences", "the service names no Secret")
    if not observed.known:
        names = ", ".join(r.name for r in refs)
        return References(None, "SecretsNotObserved",
                          f"the operator cannot tell yet whether Secret {names} exists in "
                          f"namespace {namespace}: its watch of Secret names has not listed "
                          "it yet, or is not permitted (the chart's rbac.watchSecrets)")
    missing = [r for r in refs if r.name not in observed.present]
    if not missing:
        found = ", ".join(f"{r.name} ({r.field})" for r in refs)
        return References(True, "SecretsFound", f"Secret {found} exists in namespace "
                          f"{namespace}")
    said = "; ".join(
        f"Secret {r.name} ({r.field}: {r.purpose}) does not exist in namespace {namespace}: "
        f"create it ({r.create}) or change {r.field}" for r in missing)
    return References(False, "SecretNotFound",
                      f"{said}. Pods that need it do not start (ContainerCreating, "
                      "CreateContainerConfigError) until it exists, then start by themselves")
