"""`glm-operator run`: the operator process (kopf), optionally behind Lease leader election."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import kopf
from prometheus_client import start_http_server

from glm_operator.config import OperatorConfig
from glm_operator.controllers import scheduled, triggers
from glm_operator.controllers.handling_watch import WATCH, HandlingStuck
from glm_operator.controllers.relists import QuietRelistWatch
from glm_operator.controllers.scope import NamespaceScope
from glm_operator.controllers.scope import configure as configure_scope
from glm_operator.kube.client import KubeClient, kubeconfig_connection
from glm_operator.kube.lease import LeaderElector, LeaseSettings, default_identity
from glm_operator.webhook.server import WebhookServer
from glm_operator.wellknown import PREFIX

# Exit status of a leader that lost its Lease: the pod restarts and comes back as a follower.
LOST_LEASE_EXIT = 3

log = logging.getLogger("glm_operator")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[],
                       help="manage this namespace (repeatable). Globs as kopf's ('team-*', "
                            "'*,!kube-*') watch cluster-wide and filter; exact names watch "
                            "each namespace")
    scope.add_argument("-A", "--all-namespaces", action="store_true",
                       help="watch every namespace (the default without --namespace)")
    parser.add_argument("--config", type=Path, help="operator config YAML (images, profiles)")
    parser.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then KUBECONFIG)")
    parser.add_argument("--liveness", default="http://0.0.0.0:8081/healthz",
                        help="liveness endpoint URL ('' to disable)")
    parser.add_argument("--metrics-port", type=int, default=8082,
                        help="port of the operator's Prometheus metrics (0 to disable)")
    parser.add_argument("--log-format", choices=("plain", "json"), default="plain")
    webhook = parser.add_argument_group(
        "conversion webhook", "HTTPS POST /convert for the API server, served by every "
                              "replica (docs/install.md#upgrading-from-v1alpha1)")
    webhook.add_argument("--webhook-port", type=int, default=0,
                         help="port of the conversion webhook (0, the default: not served)")
    webhook.add_argument("--webhook-bind", default="0.0.0.0",
                         help="address the conversion webhook listens on (default 0.0.0.0)")
    webhook.add_argument("--webhook-cert-file", type=Path,
                         default=Path("/etc/glm-operator-webhook/tls.crt"),
                         help="its certificate (PEM; read again when the file changes)")
    webhook.add_argument("--webhook-key-file", type=Path,
                         default=Path("/etc/glm-operator-webhook/tls.key"),
                         help="its private key (PEM)")
    parser.add_argument("--workers", type=int, default=16, help="reconcile threads")
    parser.add_argument("--resync-seconds", type=float, default=300,
                        help="backstop re-check of every GLMService (reads memory, writes drift)")
    parser.add_argument("--verbose", action="store_true")
    election = parser.add_argument_group(
        "leader election", "run several replicas with exactly one reconciling (docs/ha.md)")
    election.add_argument("--leader-elect", action="store_true",
                          help="reconcile only while holding a coordination.k8s.io Lease")
    election.add_argument("--leader-elect-lease", default="glm-operator",
                          help="name of the Lease (default: glm-operator)")
    election.add_argument("--leader-elect-namespace",
                          default=os.environ.get("POD_NAMESPACE") or "default",
                          help="namespace of the Lease (default: $POD_NAMESPACE, else default)")
    election.add_argument("--leader-elect-identity", default=None,
                          help="this replica's identity (default: $POD_NAME, else host_uuid)")
    election.add_argument("--leader-elect-lease-duration", type=float, default=15.0,
                          help="seconds a follower waits for an unrenewed Lease (default 15)")
    election.add_argument("--leader-elect-renew-deadline", type=float, default=10.0,
                          help="seconds the leader keeps trying to renew before it exits "
                               "(default 10; must be below the lease duration)")
    election.add_argument("--leader-elect-retry-period", type=float, default=2.0,
                          help="seconds between tries to take or renew the Lease (default 2)")


def lease_settings(args: argparse.Namespace) -> LeaseSettings:
    return LeaseSettings(
        name=args.leader_elect_lease,
        namespace=args.leader_elect_namespace,
        identity=args.leader_elect_identity or default_identity(),
        lease_duration=args.leader_elect_lease_duration,
        renew_deadline=args.leader_elect_renew_deadline,
        retry_period=args.leader_elect_retry_period,
    )


def run(args: argparse.Namespace) -> int:
    config = OperatorConfig.load(args.config) if args.config else OperatorConfig()
    kube = KubeClient.from_environment(args.kubeconfig)
    elector = LeaderElector(kube, lease_settings(args)) if args.leader_elect else None
    assert triggers  # importing it registers every kopf handler
    scheduled.start(kube, config, config.profiles)
    _configure_logging(args)
    if args.metrics_port:
        start_http_server(args.metrics_port)
    if args.webhook_port:
        # Before leader election: the API server calls any replica behind the Service.
        WebhookServer(args.webhook_bind, args.webhook_port, args.webhook_cert_file,
                      args.webhook_key_file).start()

    if elector is not None:
        stop = threading.Event()
        with _stop_on_signals(stop), _follower_liveness(args.liveness):
            if not elector.acquire(stop):
                return 0
        elector.keep_renewing(on_lost=_exit_lost_lease)
    try:
        _run_kopf(args)
    finally:
        if elector is not None:
            # kopf has stopped every handler: hand over now rather than after expiry.
            elector.release()
    return 0


def _configure_logging(args: argparse.Namespace) -> None:
    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.PLAIN,
    )
    logging.getLogger("kopf.objects").addFilter(QuietRelistWatch())


def _run_kopf(args: argparse.Namespace) -> None:
    @kopf.on.startup()
    def _settings(settings: kopf.OperatorSettings, **_: Any) -> None:
        # kopf's bookkeeping goes into annotations with our prefix, never into status.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=PREFIX, key="last-handled-configuration")
        settings.persistence.finalizer = f"{PREFIX}/finalizer"
        settings.execution.max_workers = args.workers
        settings.posting.level = logging.INFO
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        # kopf's defaults wait up to 5 minutes on one stuck request (an initial LIST, a
        # patch) with no connect limit: until every watch has listed, kopf holds every
        # handler, so one hung connection would leave the operator deaf for minutes.
        settings.watching.connect_timeout = 10
        settings.networking.connect_timeout = 10
        settings.networking.request_timeout = 60
        # One active replica is the Lease's job (--leader-elect), not kopf peering's.
        settings.peering.standalone = True

    if args.kubeconfig:
        @kopf.on.login()
        def _login(**_: Any) -> kopf.ConnectionInfo:
            # kopf's own login finds only in-cluster credentials, KUBECONFIG (read when the
            # kubernetes package is imported) or ~/.kube/config; never this flag.
            return kubeconfig_connection(args.kubeconfig)

    @kopf.on.probe(id="handling")
    def _handling(**_: Any) -> str:
        # Fails the liveness probe when objects wait for a first handler that never comes.
        try:
            return WATCH.check()
        except HandlingStuck as exc:
            raise kopf.PermanentError(str(exc)) from None

    stop_resync = threading.Event()

    @kopf.on.startup()
    def _start_resync(**_: Any) -> None:
        threading.Thread(target=scheduled.resync_forever, args=(args.resync_seconds, stop_resync),
                         name="glm-resync", daemon=True).start()

    @kopf.on.startup()
    def _start_secret_names(**_: Any) -> None:
        scheduled.watch_secret_names(stop_resync)

    @kopf.on.cleanup()
    def _stop_resync(**_: Any) -> None:
        stop_resync.set()

    scope = NamespaceScope(tuple(args.namespace))
    configure_scope(scope)
    kopf.run(
        clusterwide=scope.cluster_wide_watch,
        namespaces=scope.kopf_namespaces,
        standalone=True,
        liveness_endpoint=args.liveness or None,
    )


def _exit_lost_lease() -> None:
    """A leader that cannot renew must stop writing before a follower may take over: exit at
    once (no graceful shutdown, whose handlers could still write), and let the pod restart."""
    logging.shutdown()
    os._exit(LOST_LEASE_EXIT)


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM/SIGINT while following: stop waiting and exit cleanly."""
    def handler(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def _follower_liveness(url: str) -> Iterator[None]:
    """Answer the liveness probe while following (kopf serves it once leading): a waiting
    replica is healthy, and must not be restarted by its probe."""
    if not url:
        yield
        return
    parts = urlsplit(url)
    path = parts.path or "/"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path.split("?")[0] == path
            body = b'{"leader": false}\n' if ok else b"not found\n"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/json" if ok else "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((parts.hostname or "0.0.0.0", parts.port or 80), Handler)
    thread = threading.Thread(target=server.serve_forever, name="glm-follower-liveness",
                              daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
