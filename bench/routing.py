"""What LLM-aware routing buys, measured side by side in one run.

    GLM_E2E_PORT_OFFSET=500 python -m bench.routing [--replicas 3] [--rounds 2] [--clients 3]
                                                    [--plot docs/routing-ttft.png]
                                                    [--json out.json]

N real llama-servers (CPU, one thread each, a random-weight model whose prefill of a shared
1,500-character system prompt takes about 0.4 s while a cached one answers in about 30 ms),
each behind its real gateway at its kwok pod's own IP; the real endpoint picker (EPP v1.5.0)
reading those pods from the local API server and scraping the gateways; the real router
(`glm-operator router`) with a ServiceAccount token, its route table from a
ConfigMap.

Workload (the inference-perf "shared prefix" shape): groups of users sharing a system prompt,
each user a two-turn conversation (the second turn carries the first). 9 system prompts:
more than one replica's prompt cache holds (2 slots plus `--cache-ram` 16 MiB, about 6
prompts of this size) but fewer than 3 replicas hold together, the regime where placement
decides hits. Three phases: the users one at a time (placement alone decides hits), `clients`
at once (below the replicas' slots; llama.cpp cannot share a prompt one slot is still
prefilling with another slot, so same-prefix requests that overlap each prefill), and a hot
group with 80 % of the users (does the picker still spread the load). Each arm gets fresh
prompts of the same shape (no arm inherits another's cache), and the arms alternate:

- `round_robin`: each request to the next pod's gateway in turn (what a Service does);
- `epp`: through the router, which asks the EPP;
- `direct`: every request to one engine's gateway (one replica).

Reported per phase and arm: TTFT p50/p90 (streaming, to the first byte of the answer), output
tokens/s, the engines' prompt-cache hit ratio (`llamacpp:prompt_tokens_cached_total` over
cached plus processed, deltas over the arm), the requests that prefilled a whole system
prompt (9 is the least: the first of each group), and how evenly load spread (each pod's
time-averaged requests in flight, the largest over the mean). Then the router's added
latency: tiny requests one at a time, straight to a pod's gateway and through the router,
alternating, with the picker's own share from the router's histogram. Targets: hit ratio >=
0.8 (round robin about 1/N), TTFT p50 at least 3x lower than round robin, throughput not
lower, no pod's load above 2x the mean, the router adding at most 1 ms p50. The figures go to
docs/performance.md; `--plot` writes the TTFT distributions of both shared-prefix phases.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import statistics
import string
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from e2e import cluster, toolchain
from e2e.epp import CONFIG as EPP_CONFIG
from e2e.epp import EndpointPicker
from e2e.kubectl import Kubectl
from e2e.llama import llama_server_binary
from e2e.models import TinyLlamaSpec, write_tiny_llama
from e2e.pod_serving import LOOPBACK_PLACEMENT, loopback_pod_ip
from e2e.routing_rig import EngineAtPodIP, RouterProcess, router_rbac, service_account_access

SERVICE = "bench"
NAMESPACE = "bench-routing"
VERSION = "v1"
ROUTER_ACCOUNT = "bench-router"
SLOTS = 2
CTX_PER_SLOT = 4096
CACHE_RAM_MIB = 16  # about four prompts of this model's size beside the two slots
PREFIX_CHARS = 1500  # one token per character on the byte vocabulary: ~1,900 with the template
MODEL = TinyLlamaSpec(n_embd=256, n_layer=4, n_head=4, n_head_kv=2, n_ff=768, dtype="f16",
                      n_ctx_train=32768, name="bench-routing")


@dataclass
class Shape:
    groups: int = 9  # distinct system prompts: > one replica's ~4, < three replicas' ~12
    cold_users: int = 1  # per cold group
    hot_users: int = 32  # the hot group: 32 of 40 users, 80 %
    turns: int = 3
    max_tokens: int = 8
    clients: int = 3  # at once, below the replicas' slots


# Equal groups: where placement decides prompt-cache hits (the hit ratio, TTFT, throughput).
SPREAD = Shape(groups=9, cold_users=8, hot_users=8, turns=2)
# One group with 80 % of the users: whether the picker still spreads the load.
HOT = Shape(groups=9, cold_users=1, hot_users=32)


@dataclass
class Result:
    ttft: float
    total: float
    tokens: int
    ok: bool
    cached: int = 0  # prompt tokens the engine took from its cache (timings.cache_n)
    processed: int = 0  # and those it prefilled (timings.prompt_n)


@dataclass
class ArmFigures:
    arm: str
    requests: int = 0
    failed: int = 0
    ttft_p50_ms: float = 0.0
    ttft_p90_ms: float = 0.0
    tokens_per_second: float = 0.0
    hit_ratio: float = 0.0
    load_max_over_mean: float = 0.0
    seconds: float = 0.0
    prefills: int = 0  # requests that prefilled a system prompt (none of it cached)
    ttfts: list[float] = field(default_factory=list)


def conversations(shape: Shape, seed: int) -> list[list[str]]:
    """Each user's system prompt, as a list of user turns (the prompt is rebuilt per turn)."""
    rng = random.Random(seed)
    letters = string.ascii_lowercase + " "
    prefixes = ["".join(rng.choice(letters) for _ in range(PREFIX_CHARS))
                for _ in range(shape.groups)]
    users: list[list[str]] = []
    for group, prefix in enumerate(prefixes):
        count = shape.hot_users if group == 0 else shape.cold_users
        for user in range(count):
            turns = [f"user {group}-{user} turn {t}: " + "".join(
                rng.choice(letters) for _ in range(40)) for t in range(shape.turns)]
            users.append([prefix, *turns])
    rng.shuffle(users)
    return users


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def stream_chat(session: aiohttp.ClientSession, url: str, messages: list[dict[str, str]],
                      max_tokens: int) -> tuple[Result, str]:
    started = time.perf_counter()
    first = None
    text = ""
    body = {"model": SERVICE, "messages": messages, "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True}
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as answer:
            if answer.status != 200:
                await answer.read()
                return Result(0, time.perf_counter() - started, 0, False), ""
            tokens = cached = processed = 0
            async for line in answer.content:
                if first is None:
                    first = time.perf_counter() - started
                if line.startswith(b"data: {"):
                    event = json.loads(line[6:])
                    timings = event.get("timings")
                    if timings:
                        cached = int(timings.get("cache_n", 0))
                        processed = int(timings.get("prompt_n", 0))
                    for choice in event.get("choices", []):
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            tokens += 1
                            text += piece
    except aiohttp.ClientError:
        return Result(0, time.perf_counter() - started, 0, False), ""
    return Result(first or 0.0, time.perf_counter() - started, tokens, True, cached,
                  processed), text


async def run_arm(arm: str, urls: Callable[[int], str], shape: Shape, seed: int
                  ) -> list[Result]:
    """Every user's turns in order, `clients` users served at once."""
    users = conversations(shape, seed)
    results: list[Result] = []
    counter = iter(range(10**9))
    queue: asyncio.Queue[list[str]] = asyncio.Queue()
    for user in users:
        queue.put_nowait(user)

    async def client(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            prefix, *turns = queue.get_nowait()
            messages = [{"role": "system", "content": prefix}]
            for turn in turns:
                messages.append({"role": "user", "content": turn})
                result, reply = await stream_chat(session, urls(next(counter)), messages,
                                                  shape.max_tokens)
                results.append(result)
                messages.append({"role": "assistant", "content": reply})

    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(*(client(session) for _ in range(shape.clients)))
    return results


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name.split("{")[0]] = values.get(name.split("{")[0], 0.0) + float(value)
    return values


class LoadSampler:
    """Each pod's requests in flight (its gateway's gauge), sampled every 100 ms."""

    def __init__(self, pods: list[EngineAtPodIP]) -> None:
        self.pods = pods
        self.sums = [0.0] * len(pods)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                values = [scrape(p.url + "/metrics").get("glm_gateway_requests_in_flight", 0.0)
                          for p in self.pods]
            except OSError:
                values = []
            if values:
                self.sums = [a + b for a, b in zip(self.sums, values, strict=True)]
                self.samples += 1
            self._stop.wait(0.1)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def max_over_mean(self) -> float:
        mean = statistics.fmean(self.sums) if self.sums else 0.0
        return max(self.sums) / mean if mean else 0.0


def engine_cache(pods: list[EngineAtPodIP]) -> tuple[float, float]:
    cached = processed = 0.0
    for pod in pods:
        values = scrape(pod.engine.url + "/metrics")
        cached += values.get("llamacpp:prompt_tokens_cached_total", 0.0)
        processed += values.get("llamacpp:prompt_tokens_total", 0.0)
    return cached, processed


def figures(arm: str, results: list[Result], seconds: float, cache_delta: tuple[float, float],
            load: float) -> ArmFigures:
    good = [r for r in results if r.ok]
    cached, processed = cache_delta
    ttfts = [r.ttft for r in good]
    return ArmFigures(
        arm=arm, requests=len(results), failed=len(results) - len(good),
        ttft_p50_ms=round(quantile(ttfts, 0.5) * 1000, 1),
        ttft_p90_ms=round(quantile(ttfts, 0.9) * 1000, 1),
        tokens_per_second=round(sum(r.tokens for r in good) / seconds, 2),
        hit_ratio=round(cached / (cached + processed), 3) if cached + processed else 0.0,
        load_max_over_mean=round(load, 2), seconds=round(seconds, 1), ttfts=ttfts,
        prefills=sum(1 for r in good if r.processed > PREFIX_CHARS // 2))


async def added_latency(router_url: str, pod_url: str, count: int) -> tuple[float, float]:
    """p50 of a tiny whole request straight to a pod's gateway and through the router."""
    body = {"model": SERVICE, "messages": [{"role": "user", "content": "ping"}],
            "max_tokens": 1}
    times: dict[str, list[float]] = {"direct": [], "router": []}
    async with aiohttp.ClientSession() as session:
        for index in range(count * 2 + 20):
            which = "direct" if index % 2 else "router"
            url = pod_url if which == "direct" else router_url
            started = time.perf_counter()
            async with session.post(url + "/v1/chat/completions", json=body) as answer:
                await answer.read()
                assert answer.status == 200, answer.status
            if index >= 20:  # warm-up: connections, the engine's cached prompt
                times[which].append(time.perf_counter() - started)
    return statistics.median(times["direct"]), statistics.median(times["router"])


def plot(reports: dict[str, list[ArmFigures]], path: Path) -> None:
    """One panel per shared-prefix phase: each arm's TTFT distribution (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = [name for name in reports if name != "hot group"]
    figure, axes = plt.subplots(1, len(phases), figsize=(6 * len(phases), 4), sharey=True)
    panels = list(getattr(axes, "flat", [axes]))
    for axis, phase in zip(panels, phases, strict=True):
        for arm in reports[phase]:
            values = sorted(v * 1000 for v in arm.ttfts)
            if values:
                axis.plot(values, [i / len(values) for i in range(1, len(values) + 1)],
                          label=f"{arm.arm} (p50 {arm.ttft_p50_ms:.0f} ms, hit "
                                f"{arm.hit_ratio:.2f})")
        axis.set_xscale("log")
        axis.set_xlabel("time to first token, ms (log)")
        axis.set_title(f"shared-prefix multi-turn load, {phase}")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(loc="lower right")
    panels[0].set_ylabel("share of requests")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)


def create_pods(kubectl: Kubectl, count: int) -> list[dict[str, Any]]:
    pods = []
    for index in range(count):
        pods.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{SERVICE}-{index}", "labels": {
                "glm-operator.dev/service": SERVICE, "glm-operator.dev/pool": "main",
                "glm-operator.dev/version": VERSION}},
            "spec": {**LOOPBACK_PLACEMENT,
                     "containers": [{"name": "engine", "image": "bench/none"}]},
        })
    kubectl.apply(pods, namespace=NAMESPACE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        listed = kubectl.get_json("pods", "-n", NAMESPACE, "-l",
                                  f"glm-operator.dev/service={SERVICE}")["items"]
        if len(listed) == count and all((p.get("status") or {}).get("podIP") for p in listed):
            return sorted(listed, key=lambda p: p["metadata"]["name"])
        time.sleep(0.3)
    raise RuntimeError("the bench pods got no IPs within 60 s")


def routes_configmap(replicas: int) -> dict[str, Any]:
    table = {"versions": [{"name": VERSION, "weight": 100, "deployment": f"{SERVICE}-main",
                           "minReplicas": replicas, "wakeTimeoutSeconds": 60,
                           "activityLease": None}],
             "mainContextTokens": CTX_PER_SLOT, "longContext": None}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{SERVICE}-routes"},
            "data": {"routes.json": json.dumps(table)}}


def measure(arms: dict[str, Callable[[int], str]], pods: list[EngineAtPodIP], shape: Shape,
            rounds: int, name: str) -> list[ArmFigures]:
    """Each arm `rounds` times, alternating (the first arm moves back one place a round)."""
    collected: dict[str, list[tuple[list[Result], float, tuple[float, float], float]]] = {
        arm: [] for arm in arms}
    order = list(arms)
    for round_index in range(rounds):
        for arm in order:
            before = engine_cache(pods)
            started = time.perf_counter()
            with LoadSampler(pods) as sampler:
                results = asyncio.run(run_arm(arm, arms[arm], shape,
                                              seed=zlib.crc32(f"{name}{round_index}{arm}".encode())))
            seconds = time.perf_counter() - started
            after = engine_cache(pods)
            collected[arm].append((results, seconds, (after[0] - before[0],
                                                      after[1] - before[1]),
                                   sampler.max_over_mean()))
            print(f"{name} round {round_index + 1} {arm}: {len(results)} requests in "
                  f"{seconds:.1f} s", file=sys.stderr)
        order = order[1:] + order[:1]
    report = []
    for arm, runs in collected.items():
        results = [r for run in runs for r in run[0]]
        seconds = sum(run[1] for run in runs)
        cache = (sum(run[2][0] for run in runs), sum(run[2][1] for run in runs))
        # the direct arm's one pod carries everything: its spread says nothing
        load = max(run[3] for run in runs) if arm != "direct" else 0.0
        report.append(figures(arm, results, seconds, cache, load))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--latency-requests", type=int, default=200)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--arms", default="round_robin,epp,direct",
                        help="which arms, comma-separated (round_robin, epp, direct)")
    parser.add_argument("--no-hot", action="store_true", help="skip the hot-group phase")
    parser.add_argument("--latency-only", action="store_true",
                        help="only the router's added latency (no shared-prefix phases)")
    parser.add_argument("--epp-weights", default="3,2,2",
                        help="the EPP's prefix, queue and KV-cache scorer weights")
    parser.add_argument("--cache-ram", type=int, default=CACHE_RAM_MIB,
                        help="each engine's --cache-ram, MiB")
    parser.add_argument("--clients", type=int, default=Shape.clients,
                        help="users served at once")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-routing-"))
    kubectl = cluster.up()
    kubectl.run("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true",
                check=False)
    kubectl.run("create", "namespace", NAMESPACE)
    model = write_tiny_llama(work / "model.gguf", MODEL)
    binary = llama_server_binary()
    pods_meta = create_pods(kubectl, args.replicas)
    pods: list[EngineAtPodIP] = []
    epp = router = None
    try:
        for pod in pods_meta:
            engine = [str(binary), "-m", str(model), "--ctx-size", str(SLOTS * CTX_PER_SLOT),
                      "--parallel", str(SLOTS), "--threads", "1", "--cache-ram",
                      str(args.cache_ram), "--metrics", "--no-warmup"]
            gateway = ["--engine-slots", str(SLOTS), "--context-length", str(CTX_PER_SLOT),
                       "--kv-cache-poll-seconds", "1"]
            pods.append(EngineAtPodIP(pod["metadata"]["name"], loopback_pod_ip(pod), engine,
                                      gateway, SERVICE, work))
        kubectl.apply([*router_rbac(NAMESPACE, ROUTER_ACCOUNT), routes_configmap(args.replicas)],
                      namespace=NAMESPACE)
        prefix_w, queue_w, kv_w = args.epp_weights.split(",")
        config = (EPP_CONFIG.replace("prefix-cache-scorer\n    weight: 3",
                                     f"prefix-cache-scorer\n    weight: {prefix_w}")
                  .replace("queue-scorer\n    weight: 2", f"queue-scorer\n    weight: {queue_w}")
                  .replace("kv-cache-utilization-scorer\n    weight: 2",
                           f"kv-cache-utilization-scorer\n    weight: {kv_w}"))
        assert args.epp_weights == "3,2,2" or config != EPP_CONFIG, "weights not applied"
        epp = EndpointPicker(toolchain.ensure("epp") / "epp", cluster.kubeconfig_path(),
                             SERVICE, NAMESPACE, work, config=config).start()
        access = service_account_access(kubectl, NAMESPACE, ROUTER_ACCOUNT, work)
        router = RouterProcess.launch(
            ["--service-name", SERVICE, "--namespace", NAMESPACE, "--routes-configmap",
             f"{SERVICE}-routes", "--picker-address", epp.address], access, work)
        time.sleep(2)  # the EPP's first scrapes of every pod
        every_arm: dict[str, Callable[[int], str]] = {
            "round_robin": lambda i: pods[i % len(pods)].url,
            "epp": lambda i: router.url,  # type: ignore[union-attr]
            "direct": lambda i: pods[0].url,
        }
        arms = {name: every_arm[name] for name in args.arms.split(",")}
        phases = [("one at a time", dataclasses.replace(SPREAD, clients=1), arms),
                  (f"{args.clients} at once", dataclasses.replace(SPREAD, clients=args.clients),
                   arms)]
        if args.latency_only:
            phases = []
        elif not args.no_hot:
            phases.append(("hot group", dataclasses.replace(HOT, clients=args.clients),
                           {k: v for k, v in arms.items() if k != "direct"}))
        reports = {name: measure(phase_arms, pods, shape, args.rounds, name)
                   for name, shape, phase_arms in phases}
        before = scrape(router.url + "/metrics")
        load_before = os.getloadavg()[0]
        direct_p50, router_p50 = asyncio.run(added_latency(router.url, pods[0].url,
                                                           args.latency_requests))
        load_after = os.getloadavg()[0]
        after = scrape(router.url + "/metrics")
        picks = (after.get("glm_router_pick_duration_seconds_count", 0)
                 - before.get("glm_router_pick_duration_seconds_count", 0))
        pick_mean_ms = ((after.get("glm_router_pick_duration_seconds_sum", 0)
                         - before.get("glm_router_pick_duration_seconds_sum", 0))
                        / picks * 1000) if picks else float("nan")
        summary: dict[str, Any] = {"phases": {}}
        for name, report in reports.items():
            by_arm = {f.arm: f for f in report}
            phase: dict[str, Any] = {"hit_ratio": {f.arm: f.hit_ratio for f in report},
                                     "prefills": {f.arm: f.prefills for f in report}}
            if "round_robin" in by_arm and "epp" in by_arm:
                rr, epp_arm = by_arm["round_robin"], by_arm["epp"]
                phase.update(
                    ttft_p50_ratio_rr_over_epp=round(rr.ttft_p50_ms / epp_arm.ttft_p50_ms, 2),
                    throughput_ratio_epp_over_rr=round(
                        epp_arm.tokens_per_second / rr.tokens_per_second, 2),
                    load_max_over_mean={f.arm: f.load_max_over_mean for f in report
                                        if f.arm != "direct"})
            summary["phases"][name] = phase
        summary.update({
            "epp_weights": args.epp_weights, "cache_ram_mib": args.cache_ram,
            "router_added_p50_ms": round((router_p50 - direct_p50) * 1000, 3),
            "direct_p50_ms": round(direct_p50 * 1000, 3),
            "router_p50_ms": round(router_p50 * 1000, 3),
            "picker_mean_ms": round(pick_mean_ms, 3),
            # the machine's 1-minute load average around the latency phase: a busy machine
            # adds to both paths, the router's more (it waits on two more processes)
            "latency_load_average": [round(load_before, 2), round(load_after, 2)],
        })
        for name, report in reports.items():
            print(f"\n{name} ({report[0].requests} requests per arm)")
            print(f"{'arm':<12} {'failed':>6} {'TTFT p50':>9} {'TTFT p90':>9} {'tok/s':>7} "
                  f"{'hit':>6} {'prefills':>8} {'load max/mean':>13}")
            for f in report:
                print(f"{f.arm:<12} {f.failed:>6} {f.ttft_p50_ms:>7.1f}ms "
                      f"{f.ttft_p90_ms:>7.1f}ms {f.tokens_per_second:>7.1f} {f.hit_ratio:>6.3f} "
                      f"{f.prefills:>8} {f.load_max_over_mean:>13.2f}")
        print(json.dumps(summary, indent=2))
        if args.plot:
            plot(reports, args.plot)
        if args.json:
            args.json.write_text(json.dumps({
                "summary": summary, "replicas": args.replicas, "rounds": args.rounds,
                "shapes": {name: asdict(shape) for name, shape, _ in phases},
                "phases": {name: [{k: v for k, v in asdict(f).items() if k != "ttfts"}
                                  for f in report] for name, report in reports.items()},
            }, indent=2))
        return 0
    finally:
        if router is not None:
            router.stop()
        if epp is not None:
            epp.stop()
        for pod in pods:
            pod.stop()
        kubectl.run("delete", "namespace", NAMESPACE, "--wait=false", check=False)


if __name__ == "__main__":
    sys.exit(main())
