"""The router: one service's front door where no inference gateway is installed.

    client ──▶ router ──(ext-proc: which pod?)──▶ endpoint picker (EPP)
                  │                                   scrapes each pod's gateway /metrics
                  └──▶ pod gateway ──▶ engine          (the version's ready pods)
                  └──▶ long-context Service             (prompt too long for the main pool)

Here: the router's lifecycle, its HTTP routes, and its inputs from the API server (the route
table, a ConfigMap the operator writes, and the service's main-pool pods, each followed by a
list-and-watch; the wakers and activity Leases of the table's versions). A completion
request's path (version, pool, wake, pick, forward) is dispatch.py's. A keyed service's
router checks the same keys as its pods' gateways (the same Secret, mounted, reloaded the
same way) from a completion request's head, before anything else; limits and audit stay in
the pods' gateways.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any, TypeVar

import aiohttp
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from glm_operator.gateway.openai.errors import GatewayError
from glm_operator.gateway.policy.audit import CLIENT_CLOSED
from glm_operator.gateway.policy.keys import REFRESHER_STALL_SECONDS, ApiKeyStore, keep_fresh
from glm_operator.gateway.policy.outcomes import request_outcome
from glm_operator.gateway.pools.activity import ActivityMarker, renew_logged
from glm_operator.gateway.proxy import authenticate, client_request_id
from glm_operator.gateway.proxy import error_response as error_response_for
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
from glm_operator.router.config import RouterConfig
from glm_operator.router.dispatch import Dispatcher, unavailable
from glm_operator.router.forward import Forwarded, PodClients
from glm_operator.router.metrics import RouterMetrics
from glm_operator.router.picker import EndpointPicker
from glm_operator.router.pods import PoolKey, ReadyPods
from glm_operator.router.prefix import PrefixIndex
from glm_operator.router.table import (
    RouteTable,
    TableError,
    VersionRoute,
    WeightedSplit,
    parse,
)
from glm_operator.router.wake import MainPoolWaker
from glm_operator.wellknown import LONG_CONTEXT_POOL, MAIN_POOL, SERVICE_LABEL

log = logging.getLogger(__name__)
AnswerT = TypeVar("AnswerT", Response, Response | Streamed)

ROUTES_KEY = "routes.json"
COMPLETION_PATHS = ("/v1/chat/completions", "/v1/completions")


def with_request_id(answer: AnswerT, request: Request) -> AnswerT:
    """The router's own answers carry an X-Request-Id as the gateway's do: the client's
    when it is a plain token, else a new one (a pod's answer carries the pod's)."""
    if isinstance(answer, Response) and not any(name.lower() == "x-request-id"
                                                for name in answer.headers):
        answer.headers["X-Request-Id"] = client_request_id(request.headers)
    return answer


class RouterApp:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.metrics = RouterMetrics.create(config.service_name)
        self.table: RouteTable | None = None
        self.table_error = ""
        self.pods = ReadyPods(config.pod_port)
        self.clients = PodClients(config.connect_timeout_seconds, config.read_timeout_seconds)
        self.prefixes = PrefixIndex()
        self.draining = False
        # The service's keys (None: an Open service), kept fresh by keep_fresh from start().
        self.keys = ApiKeyStore(config.api_keys_path,
                                check_reloads_after=REFRESHER_STALL_SECONDS
                                ) if config.api_keys_path else None
        self._split: WeightedSplit | None = None
        self._wakers: dict[PoolKey, MainPoolWaker] = {}
        self._activity: dict[str, ActivityMarker] = {}  # main pools' Leases, by version
        self.dispatch = Dispatcher(config, self.metrics, self.pods, self.clients,
                                   self.prefixes, self._wakers, self._activity)
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._watches: list[ListWatch] = []
        self._service = config.service_name
        self._identity = socket.gethostname()

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self.start_picker()
        self.start_keys()
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
        if self.config.picker_address and self.dispatch.picker is None:
            self.dispatch.picker = EndpointPicker(self.config.picker_address,
                                                  self.config.picker_timeout_seconds)

    def start_keys(self) -> None:
        """Reload the keys when their files change (a rotation), without a restart."""
        if self.keys is not None:
            self._tasks.append(asyncio.create_task(keep_fresh(self.keys)))

    @property
    def waiting(self) -> int:
        """Requests held for a ready pod."""
        return self.dispatch.waiting

    async def stop(self) -> None:
        for watch in self._watches:
            await watch.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.clients.close()
        await self.dispatch.close()
        if self.dispatch.picker is not None:
            await self.dispatch.picker.close()
        if self._session is not None:
            await self._session.close()

    def http_server(self) -> HttpServer:
        router = Router(self._not_found)
        check = self._refuse_unauthenticated if self.keys is not None else None
        for path in COMPLETION_PATHS:
            router.add("POST", path, self._completion, check)
        router.add("GET", "/v1/models", self._models)
        router.add("GET", "/healthz", self._healthz)
        router.add("GET", "/readyz", self._readyz)
        router.add("GET", "/metrics", self._metrics)
        config = self.config
        return HttpServer(router, config.max_body_bytes,
                          max_connections=config.max_connections,
                          max_buffered_bytes=config.max_buffered_bytes,
                          write_stall_timeout_seconds=config.write_stall_timeout_seconds,
                          drain_seconds=config.drain_seconds,
                          on_refusal=self._refused)

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
        return with_request_id(error_response(
            404, f"no route for {request.method} {request.path}", "not_found"), request)

    async def _models(self, request: Request) -> Response:
        """The pods' own answer (it needs their key check), from a ready pod."""
        table = self.table
        ready = [e for v in (table.versions if table else ()) for e in self.pods.of(v.pod_label)]
        if not ready:
            return with_request_id(unavailable("no version of this service has a ready pod",
                                               5), request)
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
            return with_request_id(unavailable(f"the pod {ready[0].address}: {exc}", 1),
                                   request)

    def _refuse_unauthenticated(self, request: Request) -> Response | None:
        """A keyed service's completion request without one of its keys: the gateway's 401
        from the head alone, before its body is read, so before any wake, activity Lease
        renewal, picker call or relay (dispatch.py). Counted among the server's refusals
        (`_refused`); the key is neither logged nor counted."""
        assert self.keys is not None
        try:
            authenticate(self.keys, request.headers)
        except GatewayError as err:
            return error_response_for(err, client_request_id(request.headers))
        return None

    def _refused(self, status: int, reason: str, _request: Request | None) -> None:
        """One refusal of the HTTP server's own (wire/server.py `on_refusal`)."""
        self.metrics.refusals.labels(self._service, str(status), reason).inc()

    async def _completion(self, request: Request) -> Response | Streamed:
        version_name = ""
        try:
            routed, version_name = await self._route(request)
        except asyncio.CancelledError:
            self._count(version_name, CLIENT_CLOSED, None, False)
            raise
        self._count(version_name, routed.status, routed.error_code,
                    isinstance(routed.answer, Streamed))
        return with_request_id(routed.answer, request)

    def _count(self, version: str, status: int, error_code: str | None, started: bool
               ) -> None:
        """One answer in glm_router_requests_total: its real status code (the pod's, the
        router's, 499 for a client gone) and how it ended, in the gateway's words
        (policy/outcomes.py)."""
        self.metrics.requests.labels(self._service, version or "-", str(status),
                                     request_outcome(status, error_code, started)).inc()

    async def _route(self, request: Request) -> tuple[Forwarded, str]:
        if self.draining:
            return Forwarded.own(error_response(
                503, *SHUTTING_DOWN, "server_error",
                {"Retry-After": "1", "Connection": "close"})), ""
        return await self.dispatch.route(request, self.table, self._split, self.table_error)
