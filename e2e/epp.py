"""The Gateway API Inference Extension's endpoint picker (EPP) as a process here, and an
ext-proc client that asks it for a pod the way the router does.

The binary is the toolchain component `epp` (e2e/epp_build.py, the `[epp]` pin). It runs on
this machine against the local cluster with a kubeconfig (the KUBECONFIG environment variable:
v1.5.0 has no --kubeconfig flag; controller-runtime reads the variable), with the router's
picker's rendered flags and EndpointPickerConfig (render/endpoint_picker.py epp_args and
endpoint_picker_config, only the ports and the config file's path replaced):

- no InferencePool: `--endpoint-selector` + `--endpoint-target-ports` (and NOT `--pool-name`:
  the release refuses both together, pkg/epp/server/options.go Validate). It then watches
  Pods only, in `--pool-namespace`, and needs the POD_NAME environment variable in a
  Deployment pod's shape `<name>-<hash>-<hash>` (cmd/epp/runner/runner.go
  extractDeploymentName);
- the metrics it scrapes from each pod's `<podIP>:8080/metrics` (the target port): the
  gateway's queue and KV-cache gauges, named in the config's `engineConfigs` (engine type
  `glm-gateway`, the default for pods without the engine-type label);
- plain gRPC (`--secure-serving=false`), a metrics endpoint without authentication
  (`--metrics-endpoint-auth=false`), no tracing exporter, no pprof.

`pick()` is one ext-proc stream per request, as the router holds it: RequestHeaders, then the
whole body in one RequestBody with end_of_stream, the subset hint (if any) in the metadata
context of both; it reads the header response (the chosen `ip:port` in
`x-gateway-destination-endpoint`, also in dynamic metadata `envoy.lb`) or an ImmediateResponse
(503 when no pod is a candidate), waits for the body response, then half-closes.

    with EndpointPicker(binary, kubeconfig, "chat", ns, work).start() as epp:
        choice = pick(epp.channel(), "chat", "hello")

Fixture
-------
epp_binary (session)
    The built `epp` (toolchain.ensure: outside the test's timeout, e2e/late_builds.py).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import queue
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import grpc
import pytest
import yaml
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from glm_operator.config import OperatorConfig
from glm_operator.render.endpoint_picker import endpoint_picker_config, epp_args
from google.protobuf import struct_pb2

from e2e import procstat, toolchain
from e2e.ports import free_port

POD_PORT = 8080  # the gateway's port in every engine pod (the contract's --endpoint-target-ports)
SERVICE_LABEL = "glm-operator.dev/service"
POOL_LABEL = "glm-operator.dev/pool"
START_TIMEOUT = 30.0
LOG_TAIL_LINES = 80

# The metadata the EPP reads and writes (pkg/epp/metadata/consts.go).
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
DESTINATION_NAMESPACE = "envoy.lb"
DESTINATION_KEY = "x-gateway-destination-endpoint"

# The router's picker's config as the operator renders it (weights 3, 2, 2: the release's own
# chart default; render/endpoint_picker.py says why). bench/routing.py edits the weights in
# this text.
CONFIG = yaml.safe_dump(endpoint_picker_config(), sort_keys=False)


def engine_names_config() -> str:
    """The rendered config with the metrics extractor's parameters dropped: it then reads the
    engines' own names (vLLM's for a pod without the engine-type label), not the gateway's."""
    config = copy.deepcopy(endpoint_picker_config())
    for plugin in config["plugins"]:
        if plugin["type"] == "core-metrics-extractor":
            plugin.pop("parameters")
    return yaml.safe_dump(config, sort_keys=False)


class EndpointPickerError(RuntimeError):
    """The EPP did not start or answer; the message carries the end of its log."""


def selector(service: str) -> str:
    return f"{SERVICE_LABEL}={service},{POOL_LABEL}=main"


def epp_flags(service: str, namespace: str, grpc_port: int, health_port: int,
              metrics_port: int, config_file: Path) -> list[str]:
    """The router's picker's rendered flags, with these ports and config path."""
    args = epp_args(service, namespace, OperatorConfig())
    assert args[args.index("--endpoint-selector") + 1] == selector(service), args
    assert args[args.index("--endpoint-target-ports") + 1] == str(POD_PORT), args
    for flag, value in (("--grpc-port", grpc_port), ("--grpc-health-port", health_port),
                        ("--metrics-port", metrics_port), ("--config-file", config_file)):
        args[args.index(flag) + 1] = str(value)
    return args


def picker_env(kubeconfig: Path, pod_name: str, namespace: str | None = None
               ) -> dict[str, str]:
    """The picker's environment here: the API access (KUBECONFIG) and what the Downward API
    sets in its pod (POD_NAME; NAMESPACE where given)."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "POD_NAME": pod_name}
    if namespace is not None:
        env["NAMESPACE"] = namespace
    return env


@pytest.fixture(scope="session")
def epp_binary() -> Path:
    return toolchain.ensure("epp") / "epp"


class EndpointPicker:
    """One EPP process for `service` in `namespace`, on free ports, with `kubeconfig`."""

    def __init__(self, binary: Path, kubeconfig: Path, service: str, namespace: str,
                 work: Path, config: str = CONFIG, extra_args: Sequence[str] = ()) -> None:
        self.binary, self.kubeconfig = binary, kubeconfig
        self.service, self.namespace = service, namespace
        self.work = work
        self.config, self.extra_args = config, extra_args
        self.grpc_port = self.health_port = self.metrics_port = 0
        self.log_path = work / f"epp-{service}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._channel: grpc.Channel | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def argv(self) -> list[str]:
        config_file = self.work / f"epp-{self.service}-config.yaml"
        config_file.write_text(self.config)
        return [str(self.binary),
                *epp_flags(self.service, self.namespace, self.grpc_port, self.health_port,
                           self.metrics_port, config_file),
                *self.extra_args]

    def start(self, timeout: float = START_TIMEOUT) -> EndpointPicker:
        self.work.mkdir(parents=True, exist_ok=True)
        self.grpc_port, self.health_port, self.metrics_port = (free_port() for _ in range(3))
        # A Deployment pod's name, which the EPP parses for its own (runner.go
        # extractDeploymentName).
        env = picker_env(self.kubeconfig, f"{self.service}-epp-0-local")
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env,
                                            start_new_session=True)
        try:
            self.wait_serving(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def health(self) -> bool:
        """The gRPC health service (grpc.health.v1, service ""): SERVING. It is as soon as
        the endpoint pool is set, which --endpoint-selector does at start: it says nothing
        about which pods the EPP knows."""
        with grpc.insecure_channel(f"127.0.0.1:{self.health_port}") as channel:
            check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                        request_serializer=lambda b: b,
                                        response_deserializer=lambda b: b)
            try:
                # HealthCheckRequest{} is empty; HealthCheckResponse{status: SERVING} is 08 01.
                return bool(check(b"", timeout=1) == b"\x08\x01")
            except grpc.RpcError:
                return False

    def wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise EndpointPickerError(f"epp exited ({code}):\n{self.log_tail()}")
            if self.health():
                return
            time.sleep(0.1)
        raise EndpointPickerError(f"epp not SERVING after {timeout:g} s:\n{self.log_tail()}")

    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.address)
        return self._channel

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self.process is not None and self.process.poll() is None:
            procstat.stop(self.process)

    def __enter__(self) -> EndpointPicker:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


@dataclass
class Pick:
    """What the EPP answered one request: `endpoint` ("ip:port") from the header mutation,
    `metadata_endpoint` from dynamic metadata envoy.lb, or `status` of an ImmediateResponse."""

    endpoint: str | None = None
    metadata_endpoint: str | None = None
    status: int | None = None
    body: bytes = b""
    set_headers: dict[str, str] = field(default_factory=dict)
    body_end_of_stream: bool = False
    responses: list[str] = field(default_factory=list)  # the oneof of each response, in order


def _header(key: str, value: str) -> base_pb2.HeaderValue:
    return base_pb2.HeaderValue(key=key, raw_value=value.encode())


def _metadata(subset: Sequence[str] | None) -> base_pb2.Metadata | None:
    if subset is None:
        return None
    hint = struct_pb2.Struct()
    hint.update({SUBSET_KEY: list(subset)})
    return base_pb2.Metadata(filter_metadata={SUBSET_NAMESPACE: hint})


def pick(channel: grpc.Channel, model: str, prompt: str, subset: Sequence[str] | None = None,
         headers: Sequence[tuple[str, str]] | None = None, body: bytes | None = None,
         hint_on: Sequence[str] = ("headers", "body"), timeout: float = 5.0) -> Pick:
    """One request's ext-proc stream (module docstring). `headers`: the request's headers
    (default: :method, :path, content-type); `body`: raw bytes instead of a chat request;
    `hint_on`: the messages that carry the subset hint (the EPP reads the metadata context
    of each message anew, handlers/server.go:185, and picks on the body's)."""
    if headers is None:
        headers = [(":method", "POST"), (":path", "/v1/chat/completions"),
                   ("content-type", "application/json")]
    if body is None:
        body = json.dumps({"model": model,
                           "messages": [{"role": "user", "content": prompt}]}).encode()
    metadata = _metadata(subset)
    done: queue.Queue[None] = queue.Queue()

    def requests() -> Iterator[ext_proc.ProcessingRequest]:
        yield ext_proc.ProcessingRequest(
            request_headers=ext_proc.HttpHeaders(
                headers=base_pb2.HeaderMap(headers=[_header(k, v) for k, v in headers]),
                end_of_stream=False),
            metadata_context=metadata if "headers" in hint_on else None)
        yield ext_proc.ProcessingRequest(
            request_body=ext_proc.HttpBody(body=body, end_of_stream=True),
            metadata_context=metadata if "body" in hint_on else None)
        with contextlib.suppress(queue.Empty):
            done.get(timeout=timeout)  # then half-close: no response phases are sent

    stub = ext_proc_grpc.ExternalProcessorStub(channel)
    result = Pick()
    stream = stub.Process(requests(), timeout=timeout)
    try:
        for response in stream:
            kind = response.WhichOneof("response")
            result.responses.append(str(kind))
            if kind == "request_headers":
                mutation = response.request_headers.response.header_mutation
                result.set_headers = {h.header.key: h.header.raw_value.decode()
                                      for h in mutation.set_headers}
                result.endpoint = result.set_headers.get(DESTINATION_KEY)
                fields = response.dynamic_metadata.fields
                if DESTINATION_NAMESPACE in fields:
                    inner = fields[DESTINATION_NAMESPACE].struct_value.fields
                    if DESTINATION_KEY in inner:
                        result.metadata_endpoint = inner[DESTINATION_KEY].string_value
            elif kind == "request_body":
                streamed = response.request_body.response.body_mutation.streamed_response
                if streamed.end_of_stream:
                    result.body_end_of_stream = True
                    done.put(None)
            elif kind == "immediate_response":
                result.status = int(response.immediate_response.status.code)
                result.body = response.immediate_response.body
                done.put(None)
    finally:
        done.put(None)
    return result
