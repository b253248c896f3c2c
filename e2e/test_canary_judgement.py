"""The canary's judge, with default gates, against versions that fail the way engines fail.

The operator runs a canary on the local control plane (kwok pods, the real VirtualService
weights it writes). The versions' traffic is served by real gateway processes, each in front
of an engine of e2e/misbehaving_engine.py (good, never answers, breaks streams, slow only on
long prompts), scraped by the real Prometheus with the labels the ServiceMonitor gives. A
load generator splits its requests by the VirtualService's weights, as the mesh would, and
gives up on an answer after 4 s, as a user would. Each broken canary must roll back, and a
healthy one under the same traffic must promote.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from e2e.gateway_process import GatewayProcess
from e2e.kubectl import Kubectl, wait_for
from e2e.ports import free_port
from e2e.procstat import stop
from e2e.prometheus import PrometheusServer
from e2e.test_canary import (
    SERVICE,
    canary_operator,
    fetched,
    gateway_standins,
    glm_crds,
    glms,
    ns,
    prometheus,
    roll_to,
    rollout,
    serve,
    vs_weights,
)
from e2e.test_operator import condition

__all__ = ["canary_operator", "gateway_standins", "glm_crds", "ns", "prometheus"]

REQUESTS_PER_SECOND = 16.0  # at 25 %: 4 a second to the canary, 32 per 8 s interval
CLIENT_TIMEOUT_SECONDS = 4.0
LONG_SHARE = 0.3  # of requests with a prompt over the slow engine's threshold
# Default gates: only the pace is the test's (an 8 s interval, two steps).
POLICY = {"strategy": "canary", "steps": [25, 75], "interval": "8s"}


@contextlib.contextmanager
def version_served(prometheus: PrometheusServer, namespace: str, version: str, mode: str,
                   work: Path) -> Iterator[GatewayProcess]:
    """A real gateway for `version` in front of an engine in `mode`, scraped as a pod of it."""
    port = free_port()
    work.mkdir(parents=True, exist_ok=True)
    log = (work / f"engine-{version}.log").open("wb")
    engine = subprocess.Popen([sys.executable, "-m", "e2e.misbehaving_engine", "--port",
                               str(port), "--mode", mode], stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, start_new_session=True,
                              cwd=Path(__file__).resolve().parent.parent)
    target = f"{namespace}-{version}"
    try:
        # --first-token-overdue as rendered with a TTFT gate of 3 s; warm-up off: a hung
        # engine would hold it.
        with GatewayProcess.start(
                f"http://127.0.0.1:{port}", work / f"gw-{version}",
                ["--model-version", version, "--no-warmup", "--kv-cache-poll-seconds", "0",
                 "--first-token-overdue", "3", "--request-overdue", "60"],
                service_name=SERVICE) as gateway:
            prometheus.add_target(target, f"127.0.0.1:{gateway.port}",
                                  {"namespace": namespace, "pod": f"{SERVICE}-{version}-0"})
            yield gateway
    finally:
        prometheus.remove_target(target)
        stop(engine)
        log.close()


class Traffic:
    """Streamed chats at a fixed rate, each sent to a version by the VirtualService's weights
    (read once a second), given up after CLIENT_TIMEOUT_SECONDS."""

    def __init__(self, kubectl: Kubectl, namespace: str, urls: dict[str, str]) -> None:
        self.kubectl, self.namespace, self.urls = kubectl, namespace, urls
        self.weights: dict[str, int] = {"v1": 100}
        self.results: Counter[tuple[str, str]] = Counter()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._read_weights, daemon=True),
                         threading.Thread(target=lambda: asyncio.run(self._send()),
                                          daemon=True)]

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15)

    def _read_weights(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self.weights = vs_weights(self.kubectl, self.namespace) or self.weights
            self._stop.wait(1.0)

    def _pick(self) -> str:
        weights = {v: w for v, w in self.weights.items() if v in self.urls and w > 0}
        return random.choices(list(weights), list(weights.values()))[0] if weights else "v1"

    async def _send(self) -> None:
        timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_SECONDS)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            tasks: set[asyncio.Task[None]] = set()
            while not self._stop.is_set():
                task = asyncio.create_task(self._one(session, self._pick()))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                await asyncio.sleep(1 / REQUESTS_PER_SECOND)
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _one(self, session: aiohttp.ClientSession, version: str) -> None:
        text = "x" * 400 if random.random() < LONG_SHARE else "hello"
        body = {"model": SERVICE, "stream": True, "max_tokens": 8,
                "messages": [{"role": "user", "content": text}]}
        try:
            async with session.post(self.urls[version] + "/v1/chat/completions",
                                    json=body) as response:
                data = await response.read()
                ok = response.status == 200 and data.rstrip().endswith(b"data: [DONE]")
                self.results[(version, "ok" if ok else f"bad {response.status}")] += 1
        except TimeoutError:
            self.results[(version, "gave up")] += 1
        except aiohttp.ClientError:
            self.results[(version, "broken")] += 1


@pytest.mark.parametrize(("mode", "expected"), [
    ("hang", "RolledBack"),
    ("break", "RolledBack"),
    ("slow-long", "RolledBack"),
    ("good", "Succeeded"),
])
def test_default_gates_roll_back_a_broken_canary_and_promote_a_healthy_one(
        kubectl: Kubectl, ns: str, prometheus: PrometheusServer, tmp_path: Path, mode: str,
        expected: str) -> None:
    with version_served(prometheus, ns, "v1", "good", tmp_path) as stable, \
            version_served(prometheus, ns, "v2", mode, tmp_path) as canary, \
            Traffic(kubectl, ns, {"v1": stable.url, "v2": canary.url}) as traffic:
        # One replica per version and a short drain: the deleted pods of the tests before
        # (kwok keeps them for their grace period) do not hold the CPU nodes' capacity.
        svc = serve(kubectl, ns, "v1", replicas=1, rollout=POLICY,
                    gateway={"access": "Open", "maxDrainSeconds": 1})
        fetched(kubectl, ns, "v2")
        roll_to(kubectl, ns, svc, "v2")
        wait_for(lambda: rollout(kubectl, ns).get("phase") in ("RolledBack", "Succeeded"),
                 timeout=150, what=f"the canary ({mode}) judged: {dict(traffic.results)}")
        state: dict[str, Any] = rollout(kubectl, ns)
        print(f"{mode}: {state.get('message')}; traffic {dict(traffic.results)}")
        assert state["phase"] == expected, (state, dict(traffic.results))
        last = state["lastAnalysis"]
        status = glms(kubectl, ns)["status"]
        if expected == "RolledBack":
            assert last["verdict"] == "Failed", last
            assert status["stableModelVersion"] == "v1"
            assert condition(glms(kubectl, ns), "CanaryProgressing")["reason"] == "RolledBack"
            gates = " ".join(last["failedGates"])
            if mode == "slow-long":
                assert "p99 latency" in gates or "p99 time to first token" in gates, last
            else:
                assert "failure rate" in gates, last
                assert last["errorRatePercent"] > 50, last
            # judged against the stable version, which served well meanwhile
            assert last["stableRequestCount"] >= 20 and last["stableErrorRatePercent"] == 0
        else:
            assert last["verdict"] == "Passed", last
            wait_for(lambda: glms(kubectl, ns)["status"].get("stableModelVersion") == "v2",
                     timeout=30, what="v2 stable")
        assert traffic.results[("v1", "ok")] > 0
