"""The request path: one completion request from the client's body to a pod's answer.

The version (the `x-glm-version` pin, else the route table's weights, split exactly), the
pool (a prompt too long for the main pool goes to the long-context pool), a ready pod of
that version (held while the version wakes from zero), the pod the endpoint picker chooses
among them (or, when it fails, what the service's failure mode says), then the request is
relayed to that pod's gateway, streams included, another ready pod taking it where the
first could not be reached. Of the body only what is routed on is decoded (body.py), and
the decoded JSON is dropped before the request waits or is relayed: the pod gets the client's
bytes.

Keys before a wake. A wake puts a GPU to work for minutes and a renewed activity Lease keeps
it there, so who may cause them is who may use the service. A keyed service's router holds
the same keys as its pods' gateways (spec.gateway.apiKeysSecret, mounted read-only and
reloaded without a restart, as the gateways do: policy/keys.py) and checks them the same way,
from the request's head, before its body is read (app.py's head check on the completion
routes): a request without one of them is answered the gateway's 401 (OpenAI's error shape,
`WWW-Authenticate`) and never reaches this module, so it wakes nothing, renews no Lease, is
not sent to the picker and is not relayed. Every request here has a valid key, or belongs to
a service with `access: Open`, which anyone may use and so anyone may wake: no key is asked
for there. The pods' gateways check the key again (they are reachable around the router).

It reads what app.py keeps current from the API server (the route table, the ready pods,
the wakers and activity Leases) and writes nothing of it back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp

from glm_operator.gateway.pools.activity import ActivityMarker
from glm_operator.gateway.wire.messages import Request, Response, error_response
from glm_operator.router.body import routed_fields
from glm_operator.router.config import RouterConfig
from glm_operator.router.forward import (
    CacheReport,
    Forwarded,
    PodClients,
    PodUnreachable,
    forward,
    identity_headers,
)
from glm_operator.router.metrics import RouterMetrics
from glm_operator.router.picker import EndpointPicker, PickFailed
from glm_operator.router.pods import PodEndpoint, PoolKey, ReadyPods
from glm_operator.router.prefix import PrefixIndex
from glm_operator.router.table import RouteTable, VersionRoute, WeightedSplit
from glm_operator.router.unframed import stream_unframed
from glm_operator.router.wake import MainPoolWaker
from glm_operator.wellknown import LONG_CONTEXT_POOL, MAIN_POOL

log = logging.getLogger(__name__)

VERSION_HEADER = "x-glm-version"
REFUSED_RETRY_SECONDS = 0.25
SHOWN_VERSIONS = 3  # named in an unknown pin's 400


def unknown_version(pin: str, names: tuple[str, ...]) -> str:
    """The 400's message: how many versions the service has, and at most SHOWN_VERSIONS of
    them (the list is the service's, not every client's to read)."""
    shown = pin if len(pin) <= 80 else pin[:80] + "..."
    serves = (f"{len(names)} versions, among them {', '.join(names[:SHOWN_VERSIONS])}"
              if len(names) > SHOWN_VERSIONS else
              f"{len(names)} version{'s' if len(names) > 1 else ''}: {', '.join(names)}")
    return f"{VERSION_HEADER}: {shown!r} is not a version of this service; it serves {serves}."


def unavailable(message: str, retry_after: float, code: str = "unavailable") -> Response:
    return error_response(503, message, code, "server_error",
                          {"Retry-After": str(max(1, round(retry_after)))})


class Dispatcher:
    """The request path's own state: the picker, each pod's requests in flight, the
    requests held for a ready pod. The rest it shares with the app (pods, wakers, Leases)."""

    def __init__(self, config: RouterConfig, metrics: RouterMetrics, pods: ReadyPods,
                 clients: PodClients, prefixes: PrefixIndex,
                 wakers: dict[PoolKey, MainPoolWaker],
                 activity: dict[str, ActivityMarker]) -> None:
        self.config = config
        self.metrics = metrics
        self.pods = pods
        self.clients = clients
        self.prefixes = prefixes
        self.picker: EndpointPicker | None = None  # made by the app's start: grpc.aio binds
        # a channel to the loop running when it is made
        self.waiting = 0
        # HTTP/1.0 clients' streams (unframed.py), made on the first: its own connections,
        # so that such clients never take the API server's watches' share of a pool
        self._unframed: aiohttp.ClientSession | None = None
        self._wakers = wakers
        self._activity = activity
        self._in_flight: dict[str, int] = {}
        self._turn = 0
        self._service = config.service_name

    async def route(self, request: Request, table: RouteTable | None,
                    split: WeightedSplit | None, table_error: str) -> tuple[Forwarded, str]:
        """The answer and how it ended, and the version's name ("" before one is
        chosen)."""
        answer, version = await self._route(request, table, split, table_error)
        return (Forwarded.own(answer) if isinstance(answer, Response) else answer), version

    async def _route(self, request: Request, table: RouteTable | None,
                     split: WeightedSplit | None, table_error: str
                     ) -> tuple[Response | Forwarded, str]:
        if table is None or split is None:
            return unavailable(f"the router has no route table yet "
                               f"({table_error or 'not read'})", 1), ""
        if request.too_large:  # the server kept none of it, and closes the connection
            return error_response(413, f"Request body is larger than the limit of "
                                  f"{self.config.max_body_bytes} bytes.",
                                  "request_too_large"), ""
        fields = routed_fields(request.body)  # the decoded JSON is gone once it returns
        if fields is None:
            return error_response(400, "The request body must be a JSON object.",
                                  "invalid_json"), ""
        pin = request.headers.get(VERSION_HEADER)
        if pin is not None:
            pin = pin.strip()  # a field value's surrounding whitespace is not the value's
            pinned = table.version(pin)
            if pinned is None:
                return error_response(400, unknown_version(pin, table.names),
                                      "unknown_version"), ""
            version = pinned
        else:
            chosen = table.version(split.next())
            assert chosen is not None
            version = chosen
        answer_headers = {"X-Glm-Version": version.name}
        pod_headers = identity_headers(request, {})
        pool, route = MAIN_POOL, version
        long_context = table.long_context
        if (long_context is not None and table.main_context_tokens
                and fields.prompt_chars / self.config.chars_per_token
                > table.main_context_tokens):
            long_route = long_context.route_for(version)
            if long_route is not None:
                pool, route = LONG_CONTEXT_POOL, long_route
                answer_headers["X-Glm-Pool"] = LONG_CONTEXT_POOL
        ready = self.pods.of(route.pod_label, pool)
        held_until = None
        if not ready:
            held_until = asyncio.get_running_loop().time() + route.wake_timeout_seconds
            ready_or_answer = await self._wait_for_pods(route, pool)
            if isinstance(ready_or_answer, Response):
                return ready_or_answer, version.name
            ready = ready_or_answer
        return await self._send(request, route, pool, ready, fields.stream, pod_headers,
                                answer_headers, held_until, fields.prefix,
                                fields.text_chars), version.name

    async def _wait_for_pods(self, version: VersionRoute, pool: str
                             ) -> tuple[PodEndpoint, ...] | Response:
        if self.waiting >= self.config.max_waiting:
            return unavailable(
                f"version {version.name} has no ready pod and {self.waiting} requests wait "
                f"for one already (--max-waiting)", 5, "too_many_waiting")
        waker = self._wakers.get((pool, version.name))
        if waker is not None:
            waker.wake()
        gauge = self.metrics.waiting.labels(self._service)
        self.waiting += 1
        gauge.set(self.waiting)
        try:
            ready = await self.pods.wait_for(version.pod_label, version.wake_timeout_seconds,
                                             pool)
        finally:
            self.waiting -= 1
            gauge.set(self.waiting)
        if not ready:
            why = (f"it was woken from zero and is not ready after "
                   f"{version.wake_timeout_seconds:g} s" if waker is not None else
                   f"none became ready within {version.wake_timeout_seconds:g} s")
            if waker is not None and waker.last_error:
                why += f" (the wake failed: {waker.last_error})"
            return unavailable(f"version {version.name} has no ready pod in its "
                               f"{pool} pool: {why}",
                               min(version.wake_timeout_seconds, 60), "not_ready")
        return ready

    async def _send(self, request: Request, version: VersionRoute, pool: str,
                    ready: tuple[PodEndpoint, ...], stream: bool, pod_headers: bytes,
                    answer_headers: dict[str, str], held_until: float | None = None,
                    text: str = "", text_chars: int = 0) -> Response | Forwarded:
        """`held_until`: the request waited for the version's first ready pod, whose gateway
        may not listen yet (Ready is the kubelet's word, a moment ahead of the socket): a
        refused connection is tried again until then, as nothing was sent."""
        if pool == MAIN_POOL:
            address, reason = await self._choose(request, ready)
        else:  # the picker's selector is the main pool; long requests are few and long
            address, reason = self._least_loaded(ready), "long_context"
        if address is None:
            return unavailable(
                f"the endpoint picker failed ({reason}) and this service fails closed "
                "(spec.routing.failureMode: FailClose)", 1, "picker_unavailable")
        self.metrics.picks.labels(self._service, reason).inc()
        if pool == MAIN_POOL:
            predicted = self.prefixes.predict_and_record(address, text)
            self.metrics.prompt_chars.labels(self._service, version.name).inc(text_chars)
            self.metrics.prompt_chars_predicted.labels(self._service, version.name).inc(
                predicted)
        tried = {address}
        while True:
            try:
                return await self._forward_counted(request, address, version, pool, stream,
                                                   pod_headers, answer_headers)
            except PodUnreachable as exc:
                # Nothing was sent: another ready pod of the version takes it, once each.
                log.warning("%s; trying another pod", exc)
                others = tuple(e for e in self.pods.of(version.pod_label, pool)
                               if e.address not in tried)
                loop = asyncio.get_running_loop()
                if not others and held_until is not None and loop.time() < held_until:
                    await asyncio.sleep(REFUSED_RETRY_SECONDS)
                    tried.clear()
                    others = self.pods.of(version.pod_label, pool)
                if not others:
                    return unavailable(f"no pod of version {version.name} could be "
                                       f"reached (last: {exc})", 1)
                address = self._least_loaded(others)
                tried.add(address)

    async def _forward_counted(self, request: Request, address: str, version: VersionRoute,
                               pool: str, stream: bool, pod_headers: bytes,
                               answer_headers: dict[str, str]) -> Forwarded:
        """Forward, counting the request in the pod's load and the version's activity."""
        marker = self._activity.get(version.name) if pool == MAIN_POOL else None
        self._in_flight[address] = self._in_flight.get(address, 0) + 1
        if marker is not None:
            marker.begin()
        try:
            if stream and not request.http11:
                if self._unframed is None:
                    self._unframed = aiohttp.ClientSession(
                        connector=aiohttp.TCPConnector(limit=0, force_close=True))
                return await stream_unframed(request, self._unframed, address,
                                             answer_headers, self._cache(version),
                                             self.config.connect_timeout_seconds,
                                             self.config.read_timeout_seconds)
            return await forward(request, self.clients, address, request.body, stream,
                                 pod_headers, answer_headers, self._cache(version),
                                 self.config.read_timeout_seconds)
        finally:
            left = self._in_flight[address] - 1
            if left > 0:
                self._in_flight[address] = left
            else:
                del self._in_flight[address]
            if marker is not None:
                marker.end()

    async def close(self) -> None:
        if self._unframed is not None:
            await self._unframed.close()

    async def _choose(self, request: Request, ready: tuple[PodEndpoint, ...]
                      ) -> tuple[str | None, str]:
        if self.picker is None:
            return self._least_loaded(ready), "least_loaded"
        if len(ready) == 1:
            # The pick is forced: the picker's answer could only be this pod or a failure, and
            # its round trip is most of what the router adds to a request.
            return ready[0].address, "single"
        addresses = [e.address for e in ready]
        headers = {":method": "POST", ":path": request.path, ":authority": "router",
                   "content-type": "application/json"}
        if "x-request-id" in request.headers:
            headers["x-request-id"] = request.headers["x-request-id"]
        started = time.perf_counter()
        try:
            pick = await self.picker.pick(headers, request.body, addresses)
        except PickFailed as exc:
            failure = exc.reason
            detail = str(exc)
        else:
            self.metrics.pick_duration.labels(self._service).observe(
                time.perf_counter() - started)
            if pick.address in addresses:
                return pick.address, "endpoint_picker"
            failure, detail = "invalid", f"the picker chose {pick.address}, not a ready pod"
        self.metrics.picker_failures.labels(self._service, failure).inc()
        log.warning("endpoint picker: %s", detail)
        if self.config.picker_failure_mode == "closed":
            return None, failure
        return self._least_loaded(ready), "fail_open"

    def _least_loaded(self, ready: tuple[PodEndpoint, ...]) -> str:
        """The ready pod with the fewest of this router's requests, ties taken in turn."""
        self._turn += 1
        count = len(ready)
        best = min(range(count), key=lambda i: (self._in_flight.get(ready[i].address, 0),
                                                (i - self._turn) % count))
        return ready[best].address

    def _cache(self, version: VersionRoute) -> Any:
        prompt = self.metrics.prompt_tokens.labels(self._service, version.name)
        cached = self.metrics.prompt_tokens_cached.labels(self._service, version.name)

        def note(report: CacheReport) -> None:
            prompt.inc(report.prompt_tokens)
            cached.inc(report.cached_tokens)
        return note
