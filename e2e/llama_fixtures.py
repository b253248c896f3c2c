"""Plans rendered into llama-server argv and started for real: shared by the llama tests.

The cross-checks (e2e/test_engine_argv.py, e2e/test_planner_truth.py) go the way the operator
goes: facts from the GGUF header as the fetch Job measures them, `plan()` for the `cpu`
profile, `llamacpp_argv()` for the command line, and the pinned llama-server started with
exactly that argv (only the port and the model path are chosen here, through the renderer's
own parameters).

    facts = facts_of(model_path)
    plan = cpu_plan(facts, CpuCase("s2-unified", slots=2, context=2048, kv_unified=True))
    argv = rendered_argv(plan, model_path, port)
    with start_rendered(argv, port, binary, log_dir) as server:
        report = LoadReport.parse(server.log_text())

Fixture
-------
llama_binary (module): the pinned llama-server (e2e.toolchain builds it on first use). A build
    failure is an error, never a skip, locally and in CI.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from glm_operator.fetch.gguf_header import read_gguf_file
from glm_operator.planning.facts import ArchitectureFacts
from glm_operator.planning.planner import Plan, PlanRequest, plan
from glm_operator.render.engine_args import llamacpp_argv

from e2e.llama import LlamaServer, llama_server_binary, with_local_sockets

MiB = 1024**2
# The cores a replica may use here: the test machine has two, shared with everything else.
TEST_CPU_CORES = 2
# The pinned build logs the load sizes (model/KV/compute buffers, llama_context settings) at
# trace level (4); its default threshold is info (3). Set through the environment so the
# argv stays exactly as rendered.
LOAD_LOG_ENV = {"LLAMA_ARG_LOG_VERBOSITY": "4"}


@pytest.fixture(scope="module")
def llama_binary() -> Path:
    return llama_server_binary()


def facts_of(model: Path) -> ArchitectureFacts:
    """Planner facts as the operator gets them: the fetch Job's header reader and the file size."""
    header = read_gguf_file(model)
    return ArchitectureFacts.from_gguf_metadata(header.metadata, file_size=model.stat().st_size)


@dataclass(frozen=True)
class CpuCase:
    """One CPU plan of the matrix: what a GLMService would ask for."""

    name: str
    slots: int = 1
    context: int = 4096  # per request; the planner pads it to 256
    kv_cache_type: str = "f16"
    kv_unified: bool = False
    mmap: bool = True
    # The planner fixes the batch sizes (2048 / 512); a case may override them in the plan's
    # settings to check the renderer's batch flags with other values.
    batch_size: int | None = None
    ubatch_size: int | None = None

    def __str__(self) -> str:
        return self.name


def cpu_plan(facts: ArchitectureFacts, case: CpuCase) -> Plan:
    request = PlanRequest(
        facts=facts,
        quantization=facts.quantization or "F16",
        engine="llamacpp",
        accelerator="cpu",
        context_length=case.context,
        concurrency=case.slots,
        kv_cache_type=case.kv_cache_type,
        kv_unified=case.kv_unified,
        mmap=case.mmap,
        cpu_cores=TEST_CPU_CORES,
    )
    result = plan(request)
    assert result.feasible, result.reason
    assert result.llamacpp is not None
    if case.batch_size or case.ubatch_size:
        settings = replace(
            result.llamacpp,
            batch_size=case.batch_size or result.llamacpp.batch_size,
            ubatch_size=case.ubatch_size or result.llamacpp.ubatch_size,
        )
        result = replace(result, llamacpp=settings)
    return result


def rendered_argv(plan_: Plan, model: Path, port: int, alias: str = "glm-test") -> list[str]:
    return llamacpp_argv(plan_, model_path=str(model), port=port, alias=alias)


def _engine_env(binary: Path) -> dict[str, str]:
    path = f"{binary.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, **LOAD_LOG_ENV, "PATH": path}


def start_rendered(argv: list[str], port: int, binary: Path, log_dir: Path,
                   ready_timeout: float = 180.0) -> LlamaServer:
    """Start `argv` unchanged: its `llama-server` command is found on PATH (the pinned build's
    directory first), it listens where the argv says (127.0.0.1:<port>, loopback as in the
    pod, and the pod's abstract socket, whose name alone is made unique on this machine);
    the log level comes from LOAD_LOG_ENV."""
    argv = with_local_sockets(argv, port)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"llama-server-{port}.log"
    env = _engine_env(binary)
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True,
        )
    server = LlamaServer(list(argv), port, process, log_path)
    try:
        server.wait_ready(ready_timeout)
    except BaseException:
        server.stop()
        raise
    return server


def non_loopback_address() -> str:
    """This machine's address on its default route: where another pod would connect from."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("203.0.113.1", 9))  # UDP: no packet is sent, only a route chosen
        except OSError as exc:
            pytest.fail(f"no non-loopback IPv4 address to check the engine's bind with: {exc}")
        address: str = sock.getsockname()[0]
    if address.startswith("127."):
        pytest.fail(f"the default route's address {address} is loopback")
    return address


def refuses_connections(host: str, port: int) -> bool:
    """True when nothing listens on host:port (connection refused), False when something does."""
    try:
        with socket.create_connection((host, port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


def run_to_exit(argv: list[str], binary: Path, timeout: float = 60.0
                ) -> subprocess.CompletedProcess[str]:
    """Run `argv` (found on PATH like start_rendered) until it exits; for argv it must refuse."""
    env = _engine_env(binary)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)


# ------------------------------------------------------------------ the load log

_MODEL_BUFFER = re.compile(r"model buffer size\s*=\s*([\d.]+) MiB")
_KV_BUFFER = re.compile(r"KV buffer size\s*=\s*([\d.]+) MiB")
_KV_SUMMARY = re.compile(
    r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+)/\s*(\d+) "
    r"seqs\), K \((\w+)\):\s*([\d.]+) MiB, V \((\w+)\):\s*([\d.]+) MiB"
)
_COMPUTE_BUFFER = re.compile(r"compute buffer size\s*=\s*([\d.]+) MiB")
_CONTEXT_FIELD = re.compile(r"llama_context: (\w+)\s+= (\S+)")


def _mib(text: str) -> int:
    return round(float(text) * MiB)


@dataclass(frozen=True)
class LoadReport:
    """What llama-server's load log states (sizes rounded by its %.2f MiB printing)."""

    model_buffer_bytes: int  # all "model buffer size" lines together
    kv_buffer_bytes: int  # all "KV buffer size" lines together
    kv_size_bytes: int  # the llama_kv_cache summary line (K + V)
    kv_cells: int  # per stream
    kv_layers: int
    kv_streams: int  # one per slot, or one when unified
    type_k: str
    type_v: str
    compute_buffer_bytes: int
    context: dict[str, str]  # llama_context's settings: n_ctx, n_ctx_seq, n_batch, flash_attn...

    @classmethod
    def parse(cls, log: str) -> LoadReport:
        model = [_mib(m) for m in _MODEL_BUFFER.findall(log)]
        kv = [_mib(m) for m in _KV_BUFFER.findall(log)]
        summary = _KV_SUMMARY.search(log)
        if not model or not kv or summary is None:
            raise AssertionError(
                "llama-server's log lacks the model/KV buffer lines this test reads "
                f"(model {model}, KV {kv}, summary {bool(summary)}):\n{log[-4000:]}"
            )
        return cls(
            model_buffer_bytes=sum(model),
            kv_buffer_bytes=sum(kv),
            kv_size_bytes=_mib(summary.group(1)),
            kv_cells=int(summary.group(2)),
            kv_layers=int(summary.group(3)),
            kv_streams=int(summary.group(5)),
            type_k=summary.group(6),
            type_v=summary.group(8),
            compute_buffer_bytes=sum(_mib(m) for m in _COMPUTE_BUFFER.findall(log)),
            context=dict(_CONTEXT_FIELD.findall(log)),
        )
