"""The drift check decides whether the operator writes: it must neither miss drift nor
report drift that is only server-side defaulting."""

from __future__ import annotations

from glm_operator.decide.drift import holds_intent, object_holds_intent

DESIRED = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "chat-v1", "namespace": "ns", "labels": {"a": "1"}},
    "spec": {
        "selector": {"matchLabels": {"a": "1"}},
        "template": {"spec": {"containers": [
            {"name": "engine", "args": ["-c", "8192"], "ports": [{"containerPort": 8000}]},
        ]}},
    },
}


def live_copy() -> dict:
    import copy

    live = copy.deepcopy(DESIRED)
    # What the API server adds: defaults, server metadata, status.
    live["metadata"].update(uid="u", resourceVersion="7", generation=2,
                            managedFields=[{"manager": "x"}])
    live["metadata"]["labels"]["user-added"] = "yes"
    container = live["spec"]["template"]["spec"]["containers"][0]
    container["terminationMessagePath"] = "/dev/termination-log"
    container["ports"][0]["protocol"] = "TCP"
    live["spec"]["progressDeadlineSeconds"] = 600
    live["status"] = {"readyReplicas": 1}
    return live


def test_defaults_and_server_metadata_are_not_drift() -> None:
    assert object_holds_intent(DESIRED, live_copy())


def test_changed_argument_is_drift() -> None:
    live = live_copy()
    live["spec"]["template"]["spec"]["containers"][0]["args"][1] = "4096"
    assert not object_holds_intent(DESIRED, live)


def test_removed_label_is_drift() -> None:
    live = live_copy()
    del live["metadata"]["labels"]["a"]
    assert not object_holds_intent(DESIRED, live)


def test_extra_list_element_is_drift() -> None:
    live = live_copy()
    live["spec"]["template"]["spec"]["containers"].append({"name": "intruder"})
    assert not object_holds_intent(DESIRED, live)


def test_missing_object_is_drift() -> None:
    assert not object_holds_intent(DESIRED, None)


def test_scalars_compare_by_value_not_type_mixing_bools() -> None:
    assert holds_intent(1, 1.0)
    assert not holds_intent(True, 1)
    assert not holds_intent("1", 1)


def test_merge_patch_removes_what_is_gone_and_sets_what_changed() -> None:
    from glm_operator.decide.drift import merge_patch

    old = {"rollout": {"phase": "Progressing", "weight": 10}, "plan": {"a": 1, "b": 2},
           "replicas": 2}
    new = {"plan": {"a": 1, "c": 3}, "replicas": 3}
    assert merge_patch(old, new) == {"rollout": None, "plan": {"b": None, "c": 3},
                                     "replicas": 3}
    assert merge_patch(new, new) == {}


def test_the_first_differing_field_is_named() -> None:
    from glm_operator.decide.drift import first_difference

    live = live_copy()
    live["spec"]["template"]["spec"]["containers"][0]["args"][1] = "4096"
    assert first_difference(DESIRED, live) == "spec.template.spec.containers[0].args[1]"
    live = live_copy()
    del live["metadata"]["labels"]["a"]
    assert first_difference(DESIRED, live) == "metadata.labels.a"
    live = live_copy()
    live["metadata"]["annotations"] = {}
    desired = {**DESIRED, "metadata": {**DESIRED["metadata"],
                                       "annotations": {"glm-operator.dev/plan-hash": "x"}}}
    assert first_difference(desired, live) == "metadata.annotations[glm-operator.dev/plan-hash]"


def _applied(obj: dict) -> dict:
    """What the cluster holds after the operator applied `obj`: its fields plus defaults."""
    from glm_operator.decide.drift import with_intent_hash

    live = live_copy()
    live["metadata"] = {**live["metadata"], **with_intent_hash(obj)["metadata"]}
    return live


def test_a_field_removed_from_the_intent_is_drift_although_live_holds_the_rest() -> None:
    from glm_operator.decide.drift import DriftReason, drift, with_intent_hash

    before = {**DESIRED, "metadata": {**DESIRED["metadata"], "labels": {"a": "1", "team": "x"}}}
    live = _applied(before)
    assert drift(with_intent_hash(before), live) is None
    # The user drops the `team` label from podOverrides: live still contains all of the new
    # intent, only the hash can tell.
    found = drift(with_intent_hash(DESIRED), live)
    assert found is not None and found.reason is DriftReason.INTENT_CHANGED
    assert "intent-hash" in found.path


def test_someone_elses_edit_is_live_drift_and_a_new_render_is_intent_drift() -> None:
    from glm_operator.decide.drift import DriftReason, drift, with_intent_hash

    desired = with_intent_hash(DESIRED)
    live = _applied(DESIRED)
    live["spec"]["template"]["spec"]["containers"][0]["args"][1] = "4096"
    found = drift(desired, live)
    assert found is not None and found.reason is DriftReason.LIVE_CHANGED
    assert found.path == "spec.template.spec.containers[0].args[1]"
    changed = {**DESIRED, "spec": {**DESIRED["spec"], "replicas": 2}}
    found = drift(with_intent_hash(changed), _applied(DESIRED))
    assert found is not None and found.reason is DriftReason.INTENT_CHANGED
    assert found.path == "spec.replicas"
    assert drift(desired, None) is not None and drift(desired, None).reason is DriftReason.MISSING


def test_the_hash_ignores_server_metadata_status_and_itself() -> None:
    from glm_operator.decide.drift import intent_hash, with_intent_hash

    assert intent_hash(with_intent_hash(DESIRED)) == intent_hash(DESIRED)
    served = {**DESIRED, "status": {"readyReplicas": 1},
              "metadata": {**DESIRED["metadata"], "uid": "u", "resourceVersion": "9"}}
    assert intent_hash(served) == intent_hash(DESIRED)
