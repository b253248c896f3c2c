"""Istio routing objects: subsets per version, header pins first, weights summing to 100."""

from __future__ import annotations

import pytest
from glm_operator.render.traffic import (
    VersionRoute,
    build_destination_rule,
    build_virtual_service,
    subset_name,
)

HOST = "chat.ns.svc.cluster.local"


def test_subset_names_are_dns_labels_even_for_dotted_versions() -> None:
    assert subset_name("glm-4-9b") == "glm-4-9b"
    dotted = subset_name("glm-4.6-q4")
    assert "." not in dotted and dotted != subset_name("glm-4-6-q4")
    assert len(subset_name("x" * 200)) <= 63


def test_virtual_service_pins_by_header_then_splits_by_weight() -> None:
    routes = [VersionRoute("v1", 90), VersionRoute("v2", 10)]
    vs = build_virtual_service("chat", "ns", "chat", HOST, routes, None)
    http = vs["spec"]["http"]
    assert [r["match"][0]["headers"]["x-glm-version"]["exact"] for r in http[:2]] == ["v1", "v2"]
    assert [r["route"][0]["destination"]["subset"] for r in http[:2]] == ["v1", "v2"]
    assert http[-1]["route"] == [
        {"destination": {"host": HOST, "subset": "v1"}, "weight": 90},
        {"destination": {"host": HOST, "subset": "v2"}, "weight": 10},
    ]
    assert vs["apiVersion"] == "networking.istio.io/v1"


@pytest.mark.parametrize("routes", [[], [VersionRoute("v1", 90)],
                                    [VersionRoute("v1", 90), VersionRoute("v2", 20)]])
def test_weights_must_sum_to_100(routes: list[VersionRoute]) -> None:
    with pytest.raises(ValueError, match=r"weights|at least one"):
        build_virtual_service("chat", "ns", "chat", HOST, routes, None)


def test_destination_rule_has_a_subset_per_version_and_a_pool_sized_from_the_plan() -> None:
    dr = build_destination_rule("chat", "ns", "chat", HOST,
                                [VersionRoute("v1", 100), VersionRoute("v2", 0)], 16, None)
    assert [s["labels"] for s in dr["spec"]["subsets"]] == [
        {"glm-operator.dev/version": "v1"}, {"glm-operator.dev/version": "v2"}]
    pool = dr["spec"]["trafficPolicy"]["connectionPool"]["http"]
    assert pool == {"http2MaxRequests": 16, "http1MaxPendingRequests": 16}
