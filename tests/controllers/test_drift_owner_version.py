"""A child applied by the v1alpha1 operator (its owner reference at v1alpha1) holds the
v1alpha2 operator's intent: the owner's served version is not part of it, so the upgrade
rewrites no child (the upgrade e2e found all of them rewritten)."""

from __future__ import annotations

import copy
from typing import Any

from glm_operator.decide.drift import drift, with_intent_hash


def child(owner_version: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "chat", "namespace": "ns", "ownerReferences": [{
                "apiVersion": f"serving.glm-operator.dev/{owner_version}",
                "kind": "GLMService", "name": "chat", "uid": "u-1", "controller": True}]},
            "spec": {"ports": [{"port": 8080}]}}


def test_an_owner_reference_at_the_old_version_is_no_drift() -> None:
    live = with_intent_hash(child("v1alpha1"))  # applied by the operator before v1alpha2
    assert drift(with_intent_hash(child("v1alpha2")), live) is None


def test_another_owner_is_still_drift() -> None:
    live = with_intent_hash(child("v1alpha1"))
    other = copy.deepcopy(child("v1alpha2"))
    other["metadata"]["ownerReferences"][0]["uid"] = "u-2"
    found = drift(with_intent_hash(other), live)
    assert found is not None and "ownerReferences" in found.path
