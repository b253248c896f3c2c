"""Field-set arithmetic used to bring an older operator's objects under today's ownership."""

from __future__ import annotations

from glm_operator.kube.field_sets import merged_field_sets, without_replicas

CREATED = {"f:metadata": {"f:labels": {".": {}, "f:team": {}}},
           "f:spec": {"f:replicas": {}, "f:template": {"f:metadata": {"f:labels": {"f:a": {}}}}}}
APPLIED = {"f:metadata": {"f:labels": {"f:app": {}}, "f:annotations": {"f:x": {}}},
           "f:spec": {"f:template": {"f:spec": {"f:containers": {'k:{"name":"engine"}': {}}}}}}


def test_union_keeps_every_field_either_owns() -> None:
    merged = merged_field_sets(APPLIED, CREATED)
    assert merged["f:metadata"]["f:labels"] == {"f:app": {}, ".": {}, "f:team": {}}
    assert merged["f:metadata"]["f:annotations"] == {"f:x": {}}
    assert merged["f:spec"]["f:template"] == {
        "f:spec": {"f:containers": {'k:{"name":"engine"}': {}}},
        "f:metadata": {"f:labels": {"f:a": {}}}}
    assert "f:team" not in APPLIED["f:metadata"]["f:labels"]  # inputs untouched


def test_replicas_stay_with_the_autoscaler() -> None:
    assert "f:replicas" not in without_replicas(CREATED)["f:spec"]
    assert "f:replicas" in CREATED["f:spec"]
    assert without_replicas({"f:spec": {"f:replicas": {}}}) == {}
