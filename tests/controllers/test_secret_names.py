"""The operator's view of which Secrets exist (controllers/secrets.py): a metadata-only list
and watch per scope; only names that appear or go wake the services, a first listing makes
its namespaces known, a refused watch makes them unknown again, and the watch's stream is
read line by line as metadata only."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

from glm_operator.controllers.secrets import SecretNames, watch_secrets
from glm_operator.kube.client import METADATA_WATCH, KubeClient, KubeError
from kubernetes import client as k8s


def meta(namespace: str, name: str, version: str = "1") -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name, "resourceVersion": version}}


class FakeKube:
    """Listings and watches played from a script; the stop event ends the run."""

    def __init__(self, script: list[Any], stop: threading.Event) -> None:
        self.script = script
        self.stop = stop
        self.calls: list[tuple[str, str | None, str | None]] = []

    def _next(self) -> Any:
        if not self.script:
            self.stop.set()
            return None
        step = self.script.pop(0)
        if isinstance(step, KubeError):
            raise step
        return step

    def list_metadata(self, api_version: str, kind: str, namespace: str | None
                      ) -> tuple[tuple[dict[str, Any], ...], str]:
        self.calls.append(("list", namespace, None))
        step = self._next()
        if step is None:
            raise KubeError("done")
        assert step[0] == "list", step
        return tuple(step[1]), step[2]

    def watch_metadata(self, api_version: str, kind: str, namespace: str | None,
                       resource_version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        self.calls.append(("watch", namespace, resource_version))
        step = self._next()
        if step is None:
            return
        assert step[0] == "watch", step
        yield from step[1]


def run(script: list[Any], names: SecretNames | None = None, scope: str | None = None
        ) -> tuple[SecretNames, list[tuple[str | None, frozenset[str] | None]], FakeKube]:
    names = names or SecretNames()
    stop = threading.Event()
    kube = FakeKube(script, stop)
    changes: list[tuple[str | None, frozenset[str] | None]] = []
    watch_secrets(kube, names, scope, lambda ns, n: changes.append((ns, n)),  # type: ignore[arg-type]
                  stop)
    return names, changes, kube


def test_a_first_listing_makes_the_scope_known_and_only_new_or_gone_names_wake() -> None:
    names, changes, kube = run([
        ("list", [meta("a", "keys"), meta("b", "other")], "10"),
        ("watch", [("ADDED", meta("a", "redis", "11")),
                   ("MODIFIED", meta("a", "keys", "12")),  # a name that stays: nothing
                   ("ADDED", meta("a", "keys", "13")),  # seen already: nothing
                   ("BOOKMARK", {"metadata": {"resourceVersion": "20"}}),
                   ("DELETED", meta("b", "other", "21"))]),
    ])
    assert changes == [(None, None), ("a", frozenset({"redis"})), ("b", frozenset({"other"}))]
    assert names.observed("a", ["keys", "redis", "nope"]).present == {"keys", "redis"}
    assert names.observed("b", ["other"]).present == frozenset()
    assert names.observed("b", ["other"]).known
    # watched from the listing's version; the watch the server ended resumes from the last
    # version seen, without listing again
    assert kube.calls[1] == ("watch", None, "10")
    assert kube.calls[2] == ("watch", None, "21")


def test_too_old_a_version_lists_again_and_wakes_what_changed_in_the_gap() -> None:
    _, changes, _ = run([
        ("list", [meta("a", "keys"), meta("a", "gone")], "10"),
        KubeError("too old", status=410),
        ("list", [meta("a", "keys"), meta("a", "new")], "30"),
    ])
    assert changes == [(None, None), ("a", frozenset({"gone", "new"}))]


def test_a_refused_watch_makes_its_namespaces_unknown() -> None:
    names = SecretNames()
    run([("list", [meta("a", "keys")], "10")], names, scope="a")
    assert names.observed("a", ["keys"]).known
    assert not names.observed("elsewhere", ["keys"]).known  # another scope never listed
    kube = FakeKube([("list", [meta("a", "keys")], "10"),
                     KubeError("forbidden", status=403)], threading.Event())
    watch_secrets(kube, names, "a", lambda *_: None, _StopAfter(2))  # type: ignore[arg-type]
    assert not names.observed("a", ["keys"]).known


class _StopAfter(threading.Event):
    """A stop event that is set after `n` waits (the watch's retry sleeps)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def wait(self, timeout: float | None = None) -> bool:
        self.n -= 1
        if self.n <= 0:
            self.set()
        return self.is_set()

    def is_set(self) -> bool:
        return self.n <= 0


def test_namespaces_out_of_scope_are_never_kept() -> None:
    names, _, _ = run([("list", [meta("team-a", "keys"), meta("kube-system", "x")], "1"),
                       ("watch", [("ADDED", meta("kube-system", "y", "2"))])],
                      SecretNames(contains=lambda ns: (ns or "").startswith("team-")))
    assert names.observed("team-a", ["keys"]).present == {"keys"}
    assert names.observed("kube-system", ["x", "y"]).present == frozenset()


class _Streaming(k8s.ApiClient):  # type: ignore[misc]
    """Answers a watch with the given bytes, cut in awkward places."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.headers: dict[str, str] = {}
        self.query: list[tuple[str, str]] = []

    def call_api(self, path: str, method: str, **kwargs: Any) -> Any:
        self.headers = kwargs["header_params"]
        self.query = kwargs["query_params"]
        chunks = self.chunks

        class Response:
            def stream(self, amt: Any = None, decode_content: Any = None) -> Iterator[bytes]:
                yield from chunks

            def release_conn(self) -> None:
                pass

        return Response()


def test_the_watch_asks_for_metadata_only_and_reads_events_across_chunks() -> None:
    events = [{"type": "ADDED", "object": meta("a", "keys", "5")},
              {"type": "DELETED", "object": meta("a", "old", "6")}]
    body = b"".join(json.dumps(e).encode() + b"\n" for e in events)
    api = _Streaming([body[:7], body[7:60], body[60:]])
    got = list(KubeClient(api).watch_metadata("v1", "Secret", "a", "4"))
    assert got == [(e["type"], e["object"]) for e in events]
    assert api.headers["Accept"] == METADATA_WATCH
    assert ("resourceVersion", "4") in api.query and ("watch", "true") in api.query


def test_an_error_event_is_a_kube_error_with_its_code() -> None:
    error = {"type": "ERROR", "object": {"kind": "Status", "code": 410,
                                         "message": "too old resource version"}}
    api = _Streaming([json.dumps(error).encode() + b"\n"])
    try:
        list(KubeClient(api).watch_metadata("v1", "Secret", None, "1"))
    except KubeError as exc:
        assert exc.status == 410
    else:
        raise AssertionError("no KubeError")
