"""The router: one service's front door where no inference gateway is installed.

For each request: the version (the `x-glm-version` pin, else the route table's weights,
split exactly), the pool (a prompt too long for the main pool goes to the long-context pool),
a ready pod of that version (held while the version wakes from zero), the pod the endpoint
picker chooses among them (or, when it fails, what the service's failure mode says), then
the request is relayed to that pod's gateway, streams included. Keys, limits and audit stay
in the pods' gateways.

    client ──▶ router ──(ext-proc: which pod?)──▶ endpoint picker (EPP)
                  │                                   scrapes each pod's gateway /metrics
                  └──▶ pod gateway ──▶ engine          (the version's ready pods)
                  └──▶ long-context Service             (prompt too long for the main pool)

The router's inputs come from the API server: the route table (a ConfigMap the operator
writes) and the service's main-pool pods, each followed by a list-and-watch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from typing import Any

import aiohttp
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from glm_operator.gateway.pools.activity import ActivityMarker, renew_logged
from glm_operator.gateway.router.config import RouterConfig
from glm_operator.gateway.router.forward import (
    CacheReport,
    PodClients,
    PodUnreachable,
    forward,
    identity_headers,
)
from glm_operator.gateway.router.metrics import RouterMetrics
from glm_operator.gateway.router.picker import EndpointPicker, PickFailed
from glm_operator.gateway.router.pods import PodEndpoint, PoolKey, ReadyPods
from glm_operator.gateway.router.prefix import PrefixIndex, prompt_text
from glm_operator.gateway.router.table import (
    RouteTable,
    TableError,
    VersionRoute,
    WeightedSplit,
    parse,
)
from glm_operator.gateway.router.wake import MainPoolWaker
from glm_operator.gateway.wire.messages import (
    SHUTTING_DOWN,
    Request,
    Response,
    Router,
    Streamed,
    error_response,
    json_response,
)
from glm_operator.gateway.wire.server import HttpServer
from glm_operator.kube.activity import ActivityLease, LeaseRef
from glm_operator.kube.list_watch import ListWatch, Objects
from glm_operator.kube.pod_api import PodTokenApi
from glm_operator.kube.scale import DeploymentRef, DeploymentScale
from glm_operator.wellknown import LONG_CONTEXT_POOL, MAIN_POOL, SERVICE_LABEL

log = logging.getLogger(__name__)

VERSION_HEADER = "x-glm-version"
ROUTES_KEY = "routes.json"
COMPLETION_PATHS = ("/v1/chat/completions", "/v1/completions")
REFUSED_RETRY_SECONDS = 0.25


def prompt_chars(body: dict[str, Any]) -> int:
    """Characters of prompt text in a chat or completions body (text parts only)."""
    total = 0
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        total += len(prompt)
    elif isinstance(prompt, list):
        total += sum(len(p) for p in prompt if isinstance(p, str))
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                total += len(content)
            elif isinstance(content, list):
                total += sum(len(part["text"]) for part in content
                             if isinstance(part, dict) and isinstance(part.get("text"), str))
    return total


class RouterApp:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.metrics = RouterMetrics.create(config.service_name)
        self.table: RouteTable | None = None
        self.table_error = ""
        self.pods = ReadyPods(config.pod_port)
        self.clients = PodClients(config.connect_timeout_seconds, config.read_timeout_seconds)
        self.prefixes = PrefixIndex()
        self.picker: EndpointPicker | None = None  # made in start(): grpc.aio binds a
        # channel to the loop running when it is made
        self.draining = False
        self.waiting = 0
        self._split: WeightedSplit | None = None
        self._in_flight: dict[str, int] = {}
        self._turn = 0
        self._wakers: dict[PoolKey, MainPoolWaker] = {}
        self._activity: dict[str, ActivityMarker] = {}  # main pools' Leases, by version
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._watches: list[ListWatch] = []
        self._service = config.service_name
        self._identity = socket.gethostname()

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self.start_picker()
        self._session = aiohttp.ClientSession()
        api = PodTokenApi(self.config.api_server, self.config.token_path,
                          self.config.ca_path, self._session)
        ns = self.config.namespace
        self._api = api
        self._watches = [
            ListWatch(api, f"/api/v1/namespaces/{ns}/configmaps",
                      {"fieldSelector": f"metadata.name={self.config.routes_configmap}"},
                      self._on_routes),
            ListWatch(api, f"/api/v1/namespaces/{ns}/pods",
                      {"labelSelector": f"{SERVICE_LABEL}={self._service}"},
                      self._on_pods),
        ]
        for watch in self._watches:
            watch.start()

    def start_picker(self) -> None:
        if self.config.picker_address and self.picker is None:
            self.picker = EndpointPicker(self.config.picker_address,
                                         self.config.picker_timeout_seconds)

    async def stop(self) -> None:
        for watch in self._watches:
            await watch.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.clients.close()
        if self.picker is not None:
            await self.picker.close()
        if self._session is not None:
            await self._session.close()

    def http_server(self) -> HttpServer:
        router = Router(self._not_found)
        for path in COMPLETION_PATHS:
            router.add("POST", path, self._completion)
        router.add("GET", "/v1/models", self._models)
        router.add("GET", "/healthz", self._healthz)
        router.add("GET", "/readyz", self._readyz)
        router.add("GET", "/metrics", self._metrics)
        config = self.config
        return HttpServer(router, config.max_body_bytes,
                          max_connections=config.max_connections,
                          max_buffered_bytes=config.max_buffered_bytes,
                          write_stall_timeout_seconds=config.write_stall_timeout_seconds,
                          drain_seconds=config.drain_seconds)

    # --- inputs from the API server ----------------------------------------------------------

    def _on_routes(self, objects: Objects) -> None:
        configmap = objects.get(self.config.routes_configmap)
        text = ((configmap or {}).get("data") or {}).get(ROUTES_KEY)
        if text is None:
            self.table_error = (f"ConfigMap {self.config.routes_configmap} has no "
                                f"{ROUTES_KEY}")
            return
        try:
            table = parse(text)
        except TableError as exc:
            self.table_error = str(exc)
            log.error("route table refused, the last good one stays: %s", exc)
            return
        if table != self.table:
            log.info("route table: %s", ", ".join(f"{v.name} {v.weight}%"
                                                   for v in table.versions))
            self._split = WeightedSplit(table.versions)
        self.table, self.table_error = table, ""
        self._sync_versions(table)

    def _sync_versions(self, table: RouteTable) -> None:
        assert self._session is not None
        for version in table.versions:
            lease = version.activity_lease
            if lease and version.name not in self._activity:
                marker = ActivityMarker(ActivityLease(
                    LeaseRef(self.config.api_server, self.config.namespace, lease),
                    self._identity, self.config.token_path, self.config.ca_path,
                    self._session))
                self._activity[version.name] = marker
                self._tasks.append(asyncio.create_task(marker.run()))
            self._add_waker(MAIN_POOL, version)
            if table.long_context is not None:
                long_route = table.long_context.route_for(version)
                if long_route is not None:
                    self._add_waker(LONG_CONTEXT_POOL, long_route)

    def _add_waker(self, pool: str, route: VersionRoute) -> None:
        """A pool that may sleep gets a waker (one per pool and version, kept)."""
        assert self._session is not None
        if route.min_replicas != 0 or (pool, route.name) in self._wakers:
            return
        scale = DeploymentScale(
            DeploymentRef(self.config.api_server, self.config.namespace, route.deployment),
            self.config.token_path, self.config.ca_path, self._session)
        lease = None
        if route.activity_lease:
            lease = ActivityLease(
                LeaseRef(self.config.api_server, self.config.namespace, route.activity_lease),
                self._identity, self.config.token_path, self.config.ca_path, self._session)
        self._wakers[(pool, route.name)] = MainPoolWaker(
            scale, self._lease_renewal(lease),
            self.metrics.wakes.labels(self._service, route.name).inc)

    @staticmethod
    def _lease_renewal(lease: ActivityLease | None) -> Any:
        async def renew() -> object:
            return await renew_logged(lease) if lease is not None else None
        return renew

    def _on_pods(self, objects: Objects) -> None:
        self.pods.update(objects.values())
        addresses = {e.address for eps in self.pods.by_version.values() for e in eps}
        self.clients.keep_only(addresses)
        self.prefixes.keep_only(addresses)

    # --- routes ------------------------------------------------------------------------------

    async def _healthz(self, _request: Request) -> Response:
        return json_response({"status": "ok"})

    async def _readyz(self, _request: Request) -> Response:
        if self.draining:
            return json_response({"status": "draining"}, 503)
        if self.table is None:
            return json_response({"status": "no route table",
                                  "detail": self.table_error or "not read yet"}, 503)
        return json_response({"status": "ready", "versions": list(self.table.names)})

    async def _metrics(self, _request: Request) -> Response:
        return Response(200, generate_latest(self.metrics.registry),
                        {"Content-Type": CONTENT_TYPE_LATEST})

    async def _not_found(self, request: Request) -> Response:
        return error_response(404, f"no route for {request.method} {request.path}",
                              "not_found")

    async def _models(self, request: Request) -> Response:
        """The pods' own answer (it needs their key check), from a ready pod."""
        table = self.table
        ready = [e for v in (table.versions if table else ()) for e in self.pods.of(v.pod_label)]
        if not ready:
            return self._unavailable("no version of this service has a ready pod", 5)
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items()
                   if k in ("authorization", "x-request-id")}
        try:
            async with self._session.get(f"http://{ready[0].address}/v1/models",
                                         headers=headers,
                                         timeout=aiohttp.ClientTimeout(total=10)) as answer:
                return Response(answer.status, await answer.read(),
                                {"Content-Type": answer.headers.get("Content-Type",
                                                                    "application/json")})
        except (aiohttp.ClientError, TimeoutError) as exc:
            return self._unavailable(f"the pod {ready[0].address}: {exc}", 1)

    def _unavailable(self, message: str, retry_after: float, code: str = "unavailable"
                     ) -> Response:
        return error_response(503, message, code, "server_error",
                              {"Retry-After": str(max(1, round(retry_after)))})

    async def _completion(self, request: Request) -> Response | Streamed:
        answer: Response | Streamed
        version_name = ""
        try:
            answer, version_name = await self._route(request)
        except asyncio.CancelledError:
            self.metrics.requests.labels(self._service, version_name or "-", "499").inc()
            raise
        code = answer.status if isinstance(answer, Response) else 200
        self.metrics.requests.labels(self._service, version_name or "-", str(code)).inc()
        return answer

    async def _route(self, request: Request) -> tuple[Response | Streamed, str]:
        if self.draining:
            return error_response(503, *SHUTTING_DOWN, "server_error",
                                  {"Retry-After": "1", "Connection": "close"}), ""
        table, split = self.table, self._split
        if table is None or split is None:
            return self._unavailable(f"the router has no route table yet "
                                     f"({self.table_error or 'not read'})", 1), ""
        if request.too_large:  # the server kept none of it, and closes the connection
            return error_response(413, f"Request body is larger than the limit of "
                                  f"{self.config.max_body_bytes} bytes.",
                                  "request_too_large"), ""
        try:
            body = json.loads(request.body)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            body = None
        if not isinstance(body, dict):
            return error_response(400, "The request body must be a JSON object.",
                                  "invalid_json"), ""
        pin = request.headers.get(VERSION_HEADER)
        if pin is not None:
            pinned = table.version(pin)
            if pinned is None:
                shown = pin if len(pin) <= 80 else pin[:80] + "..."
                return error_response(
                    400, f"{VERSION_HEADER}: {shown!r} is not a version of this service; it "
                    f"serves {', '.join(table.names)}.", "unknown_version"), ""
            version = pinned
        else:
            chosen = table.version(split.next())
            assert chosen is not None
            version = chosen
        stream = body.get("stream") is True
        answer_headers = {"X-Glm-Version": version.name}
        pod_headers = identity_headers(request, {})
        pool, route = MAIN_POOL, version
        long_context = table.long_context
        if (long_context is not None and table.main_context_tokens
                and prompt_chars(body) / self.config.chars_per_token
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
        return await self._send(request, route, pool, ready, stream, pod_headers,
                                answer_headers, held_until, prompt_text(body)), version.name

    async def _wait_for_pods(self, version: VersionRoute, pool: str
                             ) -> tuple[PodEndpoint, ...] | Response:
        if self.waiting >= self.config.max_waiting:
            return self._unavailable(
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
            return self._unavailable(f"version {version.name} has no ready pod in its "
                                     f"{pool} pool: {why}",
                                     min(version.wake_timeout_seconds, 60), "not_ready")
        return ready

    async def _send(self, request: Request, version: VersionRoute, pool: str,
                    ready: tuple[PodEndpoint, ...], stream: bool, pod_headers: bytes,
                    answer_headers: dict[str, str], held_until: float | None = None,
                    text: str = "") -> Response | Streamed:
        """`held_until`: the request waited for the version's first ready pod, whose gateway
        may not listen yet (Ready is the kubelet's word, a moment ahead of the socket): a
        refused connection is tried again until then, as nothing was sent."""
        if pool == MAIN_POOL:
            address, reason = await self._choose(request, ready)
        else:  # the picker's selector is the main pool; long requests are few and long
            address, reason = self._least_loaded(ready), "long_context"
        if address is None:
            return self._unavailable(
                f"the endpoint picker failed ({reason}) and this service fails closed "
                "(spec.routing.failureMode: FailClose)", 1, "picker_unavailable")
        self.metrics.picks.labels(self._service, reason).inc()
        if pool == MAIN_POOL:
            predicted = self.prefixes.predict_and_record(address, text)
            self.metrics.prompt_chars.labels(self._service, version.name).inc(len(text))
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
                    return self._unavailable(f"no pod of version {version.name} could be "
                                             f"reached (last: {exc})", 1)
                address = self._least_loaded(others)
                tried.add(address)

    async def _forward_counted(self, request: Request, address: str, version: VersionRoute,
                               pool: str, stream: bool, pod_headers: bytes,
                               answer_headers: dict[str, str]) -> Response | Streamed:
        """Forward, counting the request in the pod's load and the version's activity."""
        marker = self._activity.get(version.name) if pool == MAIN_POOL else None
        self._in_flight[address] = self._in_flight.get(address, 0) + 1
        if marker is not None:
            marker.begin()
        try:
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

    async def _choose(self, request: Request, ready: tuple[PodEndpoint, ...]
                      ) -> tuple[str | None, str]:
        if self.picker is None:
            return self._least_loaded(ready), "least_loaded"
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

