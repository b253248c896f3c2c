"""`glm-operator run`: the operator process (kopf)."""

from __future__ import annotations

import argparse
import logging
import threading
from pathlib import Path
from typing import Any

import kopf
from prometheus_client import start_http_server

from glm_operator.config import OperatorConfig
from glm_operator.controllers import handlers
from glm_operator.kube.client import KubeClient

PREFIX = "glm-operator.dev"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[],
                       help="watch this namespace (repeatable; globs allowed)")
    scope.add_argument("-A", "--all-namespaces", action="store_true",
                       help="watch every namespace (the default without --namespace)")
    parser.add_argument("--config", type=Path, help="operator config YAML (images, profiles)")
    parser.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then KUBECONFIG)")
    parser.add_argument("--peering", metavar="NAME",
                        help="join this kopf peering for HA (needs the KopfPeering CRDs); "
                             "without it the operator runs standalone")
    parser.add_argument("--liveness", default="http://0.0.0.0:8081/healthz",
                        help="liveness endpoint URL ('' to disable)")
    parser.add_argument("--metrics-port", type=int, default=8082,
                        help="port of the operator's Prometheus metrics (0 to disable)")
    parser.add_argument("--log-format", choices=("plain", "json"), default="plain")
    parser.add_argument("--workers", type=int, default=16, help="reconcile threads")
    parser.add_argument("--resync-seconds", type=float, default=300,
                        help="backstop re-check of every GLMService (reads memory, writes drift)")
    parser.add_argument("--verbose", action="store_true")


def run(args: argparse.Namespace) -> int:
    config = OperatorConfig.load(args.config) if args.config else OperatorConfig()
    kube = KubeClient.from_environment(args.kubeconfig)
    handlers.configure(handlers.Runtime(
        kube=kube, config=config, profiles=config.profiles))
    if args.metrics_port:
        start_http_server(args.metrics_port)

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
        settings.peering.standalone = args.peering is None
        if args.peering:
            settings.peering.name = args.peering
            settings.peering.mandatory = True

    stop_resync = threading.Event()

    @kopf.on.startup()
    def _start_resync(**_: Any) -> None:
        threading.Thread(target=handlers.resync_forever, args=(args.resync_seconds, stop_resync),
                         name="glm-resync", daemon=True).start()

    @kopf.on.cleanup()
    def _stop_resync(**_: Any) -> None:
        stop_resync.set()

    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.PLAIN,
    )
    namespaces = args.namespace or None
    kopf.run(
        clusterwide=namespaces is None,
        namespaces=namespaces or (),
        standalone=args.peering is None,
        peering_name=args.peering,
        liveness_endpoint=args.liveness or None,
    )
    return 0
