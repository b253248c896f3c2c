"""The operator's namespace scope: kopf's pattern meaning, and which patterns watch how."""

from __future__ import annotations

import pytest
from glm_operator.controllers.scope import NamespaceScope, matches
from kopf._cogs.structs.references import NamespaceName, match_namespace

PATTERNS = ["e2e-*", "team-a", "!kube-*", "myapp-*, !*-pr-*, *pr-123", "!*-pr-*, *pr-123",
            "t?am-[ab]", "*", "a,b"]
NAMESPACES = ["e2e-x", "e2e-", "team-a", "team-b", "kube-system", "default", "myapp-test",
              "myapp-pr-123", "myapp-pr-456", "otherapp-pr-123", "a", "b", "E2E-x"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_patterns_mean_what_they_mean_to_kopf(pattern: str) -> None:
    # `--namespace` meant kopf's syntax before globs were filtered here: it still does.
    for namespace in NAMESPACES:
        assert matches(namespace, pattern) == match_namespace(NamespaceName(namespace),
                                                              pattern), namespace


def test_globs_watch_cluster_wide_and_filter() -> None:
    scope = NamespaceScope(("team-*", "ml"))
    assert scope.cluster_wide_watch and scope.kopf_namespaces == ()
    assert scope.contains("team-x") and scope.contains("ml")
    assert not scope.contains("mlops") and not scope.contains("default")
    assert not scope.contains(None)  # a cluster-scoped object


def test_exact_names_are_watched_one_by_one() -> None:
    # A Role per namespace is all an install with exact names grants: no cluster-wide watch.
    scope = NamespaceScope(("team-a", "team-b"))
    assert not scope.cluster_wide_watch
    assert scope.kopf_namespaces == ("team-a", "team-b")
    assert scope.contains("team-a") and not scope.contains("team-c")


def test_no_patterns_is_every_namespace() -> None:
    scope = NamespaceScope()
    assert scope.cluster_wide_watch and scope.kopf_namespaces == ()
    assert scope.contains("anything") and scope.contains(None)


@pytest.mark.parametrize("pattern", ["!team-x", "a,b", "team-[ab]", "t?am"])
def test_every_kind_of_glob_watches_cluster_wide(pattern: str) -> None:
    assert NamespaceScope((pattern,)).cluster_wide_watch


def test_every_handler_and_index_filters_by_namespace() -> None:
    # With globs every kind is watched cluster-wide: a handler without the filter would
    # reconcile, index or annotate other operators' objects.
    import kopf
    from glm_operator.controllers import triggers
    from glm_operator.controllers.scope import in_scope

    assert triggers  # registers the handlers
    registry = kopf.get_default_registry()
    found = [h for r in (registry._indexing, registry._watching, registry._changing,
                         registry._spawning) for h in r.get_all_handlers()]
    assert len(found) >= 10
    assert [h.id for h in found if h.when is not in_scope] == []
