"""Object metadata every child carries: namespace, labels, owner reference."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from glm_operator.api.base import ObjectMeta


class Owned(Protocol):
    """A GLMService or ModelVersion: anything with apiVersion, kind and metadata."""

    @property
    def api_version(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def metadata(self) -> ObjectMeta: ...


class MissingMetadata(ValueError):
    """The owner lacks a name, namespace or uid the children need."""


def owner_reference(owner: Owned) -> dict[str, Any]:
    """The controller reference: deleting the owner garbage-collects the child."""
    meta = owner.metadata
    if not meta.name or not meta.uid:
        raise MissingMetadata(
            f"{owner.kind} {meta.name or '<unnamed>'}: metadata.name and metadata.uid are "
            "needed for the children's ownerReferences"
        )
    return {
        "apiVersion": owner.api_version,
        "kind": owner.kind,
        "name": meta.name,
        "uid": meta.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    owner: dict[str, Any] | None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if annotations:
        meta["annotations"] = dict(annotations)
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return meta
