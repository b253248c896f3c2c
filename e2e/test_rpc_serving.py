"""A multi-node llama.cpp replica served for real over llama.cpp's RPC backend.

The plan is the operator's for a GLMService with `accelerator: {name: nvidia-l4, count: 1,
nodes: 3}`: a leader (llama-server + gateway) and two workers running ggml-rpc-server, with the
layers split over the three nodes' devices. Here every process runs on this machine:

- each worker is `rpc_server_argv(plan)` exactly as rendered, with only its listen address
  changed (127.0.0.1 and a free port instead of 0.0.0.0:50052: the test keeps its traffic on
  loopback);
- the leader is `llamacpp_argv(plan, ..., rpc_servers=...)` exactly as rendered, the workers'
  stable hostnames replaced by their loopback addresses;
- this machine has no GPU, so the leader's own device (an L4 in the cluster) is played by a
  third ggml-rpc-server, appended after the workers: llama-server lists RPC devices first and
  its local devices last (src/llama.cpp, "add RPC servers at the front of the list"), so the
  stand-in takes the leader's place in `--tensor-split`, which the planner wrote in that order.

Checked: the replica answers a chat request; each backend's model and KV buffers in the
leader's load log (`RPC0[127.0.0.1:port] model buffer size = ...`) match the planner's
`perNode` split within 10 %.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from glm_operator.planning.planner import Plan, PlanRequest, plan
from glm_operator.render.engine_args import (
    RPC_PORT,
    RPC_SERVER,
    llamacpp_argv,
    rpc_server_argv,
)

from e2e.llama import http_json
from e2e.llama_fixtures import (
    MiB,
    facts_of,
    llama_binary,  # noqa: F401 (fixture)
    start_rendered,
)
from e2e.models import TinyLlamaSpec, write_tiny_llama
from e2e.ports import free_port

pytestmark = pytest.mark.llama

TOLERANCE = 0.10
NODES = 3
# Layers dominate the bytes (as in the models this is for): 12 blocks of 256 x 1024 in f16,
# the 259-token vocabulary is small next to them.
MODEL = TinyLlamaSpec(n_ctx_train=8192, n_layer=12, n_embd=256, n_head=4, n_head_kv=4,
                      n_ff=1024, dtype="f16", name="rpc-256x12")
_MODEL_BUFFER = re.compile(r"(RPC\d+\[([\d.]+:\d+)\])\s+model buffer size\s*=\s*([\d.]+) MiB")
_KV_BUFFER = re.compile(r"(RPC\d+\[([\d.]+:\d+)\])\s+KV buffer size\s*=\s*([\d.]+) MiB")


def multi_node_plan(model: Path) -> Plan:
    result = plan(PlanRequest(facts=facts_of(model), quantization="F16", engine="llamacpp",
                              accelerator="nvidia-l4", count=1, nodes=NODES,
                              context_length=2048, concurrency=2))
    assert result.feasible, result.reason
    assert result.llamacpp is not None and result.llamacpp.rpc_workers == NODES - 1
    assert len(result.per_node) == NODES
    return result


def loopback(argv: list[str], port: int) -> list[str]:
    """The rendered worker argv listening on 127.0.0.1:<port> instead of 0.0.0.0:50052."""
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert argv[argv.index("--port") + 1] == str(RPC_PORT)
    changed = list(argv)
    changed[changed.index("--host") + 1] = "127.0.0.1"
    changed[changed.index("--port") + 1] = str(port)
    return changed


class RpcWorker:
    def __init__(self, argv: list[str], binary_dir: Path, log: Path) -> None:
        self.port = int(argv[argv.index("--port") + 1])
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [str(binary_dir / argv[0]), *argv[1:]], stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_listening(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"{RPC_SERVER} exited {self.process.returncode}:\n"
                            f"{self.log.read_text(errors='replace')[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        pytest.fail(f"{RPC_SERVER} on port {self.port} did not listen in {timeout}s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_tiny_llama(tmp_path / "rpc.gguf", MODEL)


@pytest.fixture
def workers(model: Path, llama_binary: Path, tmp_path: Path  # noqa: F811
            ) -> Iterator[list[RpcWorker]]:
    started: list[RpcWorker] = []
    argv = rpc_server_argv(multi_node_plan(model))
    assert argv[0] == RPC_SERVER and (llama_binary.parent / RPC_SERVER).exists()
    try:
        for i in range(NODES):  # two workers, then the leader's own device's stand-in
            started.append(RpcWorker(loopback(argv, free_port()), llama_binary.parent,
                                     tmp_path / f"rpc-{i}.log"))
        for worker in started:
            worker.wait_listening()
        yield started
    finally:
        for worker in started:
            worker.stop()


def test_a_three_node_replica_serves_over_rpc_with_the_planned_split(
        model: Path, workers: list[RpcWorker], llama_binary: Path,  # noqa: F811
        tmp_path: Path) -> None:
    planned = multi_node_plan(model)
    hostnames = [f"svc-0-worker-{k}.svc-group:{RPC_PORT}" for k in range(1, NODES)]
    port = free_port()
    argv = llamacpp_argv(planned, model_path=str(model), port=port, alias="glm-rpc",
                         rpc_servers=hostnames)
    rpc_value = argv[argv.index("--rpc") + 1]
    assert rpc_value == ",".join(hostnames)
    endpoints = [f"127.0.0.1:{w.port}" for w in workers]
    argv[argv.index("--rpc") + 1] = ",".join(endpoints)  # workers, then the stand-in

    with start_rendered(argv, port, llama_binary, tmp_path) as server:
        status, body = http_json(server.url + "/v1/chat/completions", {
            "model": "glm-rpc", "max_tokens": 8,
            "messages": [{"role": "user", "content": "hello over rpc"}]}, timeout=120)
        log = server.log_text()
    assert status == 200, body
    assert body["choices"][0]["message"] is not None

    model_bytes = {endpoint: round(float(mib) * MiB)
                   for _, endpoint, mib in _MODEL_BUFFER.findall(log)}
    kv_bytes = {endpoint: round(float(mib) * MiB) for _, endpoint, mib in _KV_BUFFER.findall(log)}
    assert set(model_bytes) == set(endpoints), f"model buffers per backend: {model_bytes}\n{log}"
    assert set(kv_bytes) == set(endpoints), f"KV buffers per backend: {kv_bytes}"
    # perNode is [leader, worker 1, worker 2]; the endpoints are [worker 1, worker 2, leader].
    shares = dict(zip([*endpoints[-1:], *endpoints[:-1]], planned.per_node, strict=True))
    rows = []
    for endpoint, share in shares.items():
        rows.append(f"| {share.role} | {share.layers} | {share.weights_bytes / MiB:.2f} | "
                    f"{model_bytes[endpoint] / MiB:.2f} | {share.kv_bytes / MiB:.2f} | "
                    f"{kv_bytes[endpoint] / MiB:.2f} |")
    print("\n| node | layers | planned weights MiB | RPC model buffer MiB | planned KV MiB "
          "| RPC KV buffer MiB |\n" + "\n".join(rows))
    for endpoint, share in shares.items():
        assert abs(share.weights_bytes - model_bytes[endpoint]) <= TOLERANCE * model_bytes[
            endpoint], f"{share.role} weights: {rows}"
        assert abs(share.kv_bytes - kv_bytes[endpoint]) <= TOLERANCE * kv_bytes[endpoint], (
            f"{share.role} KV: {rows}")
