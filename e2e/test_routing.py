"""LLM-aware routing end to end: the real operator, the real endpoint picker (EPP v1.5.0), the
real router and real llama-servers, every process started from what the operator rendered.

The operator serves two GLMServices with `spec.routing.mode: EndpointPicker`, their pods
on the `loopback` nodes (spec.podOverrides), so each kwok pod has a 127.x IP this machine
binds:

- `chat`: 3 replicas of a tiny random-weight model (2 slots of 2,048 tokens each), a
  long-context pool of one replica (16,384 tokens), one router;
- `sleepy`: autoscaled with minReplicas 0 and idleSeconds 30 (the API's minimum), so
  the operator puts it to zero while the other tests run.

e2e/routing_kubelet.py plays the kubelet: engine pods run their rendered llama-server argv
and gateway args (the gateway at the pod's IP), the EPP pod the EPP binary with its rendered
args and EndpointPickerConfig (only its ports, config path and KUBECONFIG, with a token of
its own ServiceAccount, replaced), router pods the router with their rendered args (only the
listen port, the API access, a token of the router's own ServiceAccount, and the picker's
address replaced). So the rendered flags, config and RBAC are what is tested.

Which pod served a request: each request carries its own X-Request-Id, which the pod's
gateway writes in its audit line (--audit stdout, in the gateway's log here).
"""

from __future__ import annotations

import copy
import json
import random
import string
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from glm_operator.gateway.metrics import REQUESTS_QUEUED, REQUESTS_TOTAL
from glm_operator.render.long_context import activity_lease_name
from glm_operator.router.metrics import PICKS_TOTAL, WAKES_TOTAL

from e2e.epp import epp_binary
from e2e.hpa_chain import QueueLoad
from e2e.kubectl import Kubectl, wait_for
from e2e.models import TinyLlamaSpec, write_tiny_llama
from e2e.operator_fixtures import OperatorProcess, glm_crds, prefixed_namespace
from e2e.pod_serving import LOOPBACK_PLACEMENT
from e2e.routing_kubelet import EnginePod, RouterPod, RoutingKubelet
from e2e.test_operator import CPU_MV, CPU_SVC, condition, deploy_model, wait_ready

pytestmark = pytest.mark.llama

__all__ = ["epp_binary", "glm_crds"]  # fixtures used by name

PREFIX = "route-"
CHAT, SLEEPY = "chat", "sleepy"
V1 = CPU_MV["metadata"]["name"]
V2 = V1 + "-next"
MAIN_CONTEXT = 2048  # per slot: a 1,500-character system prompt and its turns fit
LONG_CONTEXT = 16384
CHARS_PER_TOKEN = 4  # the router's default estimate (its rendered args leave it)
SLOTS = 2
CONVERSATIONS = 4
IDLE_SECONDS = 30  # routing.idleSeconds' minimum
SYSTEM_CHARS = 1500
CANARY_WEIGHT = 20
WEIGHTED_REQUESTS = 500

# On the loopback nodes; the plan's CPU request (8 cores for a 9B model) would fit only three
# of the module's six engine pods on the two loopback nodes, and each runs one thread here.
PLACEMENT = {"nodeSelector": LOOPBACK_PLACEMENT["nodeSelector"],
             "tolerations": LOOPBACK_PLACEMENT["tolerations"],
             "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}


def chat_service() -> dict[str, Any]:
    svc = copy.deepcopy(CPU_SVC)
    svc["metadata"]["name"] = CHAT
    spec = svc["spec"]
    spec.update(replicas=3, contextLength=MAIN_CONTEXT, concurrency=SLOTS,
                podOverrides=copy.deepcopy(PLACEMENT),
                routing={"mode": "EndpointPicker", "routerReplicas": 1},
                longContext={"contextLength": LONG_CONTEXT, "replicas": 1})
    # A deleted pod drains this long (its processes stop with it here).
    spec["gateway"]["maxDrainSeconds"] = 1
    return svc


def sleepy_service() -> dict[str, Any]:
    svc = copy.deepcopy(CPU_SVC)
    svc["metadata"]["name"] = SLEEPY
    spec = svc["spec"]
    spec.pop("replicas", None)
    spec.update(contextLength=MAIN_CONTEXT, concurrency=SLOTS,
                podOverrides=copy.deepcopy(PLACEMENT),
                autoscaling={"minReplicas": 0, "maxReplicas": 1,
                             "targets": {"queueLength": 4}},
                routing={"mode": "EndpointPicker", "routerReplicas": 1},
                idleSeconds=IDLE_SECONDS)
    spec["gateway"]["maxDrainSeconds"] = 1
    return svc


@dataclass
class Routed:
    kubectl: Kubectl
    ns: str
    kubelet: RoutingKubelet
    operator: OperatorProcess
    created: float  # when the services were applied (monotonic)

    def router(self, service: str = CHAT) -> RouterPod:
        routers = self.kubelet.routers_of(service)
        assert len(routers) == 1, [r.pod_name for r in routers]
        return routers[0]

    def routes(self, service: str = CHAT) -> dict[str, Any]:
        configmap = self.kubectl.get_json("configmap", f"{service}-routes", "-n", self.ns)
        table: dict[str, Any] = json.loads(configmap["data"]["routes.json"])
        return table


def explain(kubectl: Kubectl, routed: RoutingKubelet | None, name: str) -> None:
    dump = kubectl.run("get", "glms,deployments,pods,configmaps,events", "-n", name, "-o",
                       "wide", check=False)
    print(f"\n--- namespace {name} ---\n{dump.stdout}{dump.stderr}")
    if routed is not None:
        print(f"kubelet errors: {routed.errors}")
        for router in [*routed.routers_of(CHAT), *routed.routers_of(SLEEPY)]:
            print(f"--- router {router.pod_name} ---\n{router.process.log_text()[-3000:]}")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A trained context above the long-context pool's, so llama-server keeps it.
    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf",
                            TinyLlamaSpec(n_ctx_train=32768))


@pytest.fixture(scope="module")
def routed(request: pytest.FixtureRequest, glm_crds: list[str], kubectl: Kubectl,
           epp_binary: Path, tiny_model: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routed]:
    operator = OperatorProcess(kubectl, namespaces=(f"{PREFIX}*",))
    kubelet: RoutingKubelet | None = None
    names: list[str] = []
    try:
        wait_for(operator.alive, timeout=60, what="glm-operator liveness endpoint")
        with prefixed_namespace(request, kubectl, PREFIX,
                                lambda name: explain(kubectl, kubelet, name)) as ns:
            names.append(ns)
            deploy_model(kubectl, ns, CPU_MV, wait_for)
            kubectl.apply([chat_service(), sleepy_service()], namespace=ns)
            created = time.monotonic()
            with RoutingKubelet(kubectl, ns, tiny_model, epp_binary,
                                tmp_path_factory.mktemp("routing")) as kubelet:
                routed = Routed(kubectl, ns, kubelet, operator, created)
                try:
                    wait_ready(kubectl, ns, CHAT, wait_for, timeout=180)
                    wait_for(lambda: (len(kubelet.engines_of(CHAT)) == 3
                                      and len(kubelet.engines_of(CHAT, "long-context")) == 1
                                      and len(kubelet.routers_of(CHAT)) == 1)
                             or kubelet.errors,
                             timeout=180, what="chat's pods served by the kubelet")
                    assert not kubelet.errors, kubelet.errors
                    yield routed
                except BaseException:
                    explain(kubectl, kubelet, ns)
                    print(f"--- operator ---\n{operator.tail(120)}")
                    raise
    finally:
        operator.stop()
        # prefixed_namespace deletes it only after a clean yield: a failed setup would leave
        # its pods holding the loopback nodes' capacity.
        for name in names:
            kubectl.run("delete", "namespace", name, "--wait=false", "--ignore-not-found",
                        check=False)


# --- helpers -------------------------------------------------------------------------------


def post(url: str, messages: list[dict[str, str]], request_id: str, max_tokens: int = 4,
         headers: dict[str, str] | None = None, timeout: float = 120) -> httpx.Response:
    body = {"model": CHAT, "messages": messages, "max_tokens": max_tokens}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=timeout,
                      headers={"X-Request-Id": request_id, **(headers or {})})


def rid(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


def served_by(engines: list[EnginePod], ids: list[str], timeout: float = 15
              ) -> dict[str, str]:
    """Which engine pod's gateway audited each request id (its pod's name)."""
    wanted = set(ids)
    found: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while True:
        for engine in engines:
            for line in engine.log_text().splitlines():
                if '"request_id"' not in line:
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("request_id") in wanted:
                    found[record["request_id"]] = engine.pod_name
        if wanted <= found.keys() or time.monotonic() > deadline:
            missing = wanted - found.keys()
            assert not missing, f"no gateway audited {sorted(missing)[:5]}"
            return found
        time.sleep(0.2)


def metric_sum(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if (series == name or series.startswith(name + "{")) and all(
                f'{k}="{v}"' in series for k, v in labels.items()):
            total += float(value)
    return total


def gateway_requests(engine: EnginePod) -> float:
    return metric_sum(engine.served.gateway.metrics_text(), REQUESTS_TOTAL)


def router_metric(router: RouterPod, name: str, **labels: str) -> float:
    return metric_sum(router.process.metrics_text(), name, **labels)


def text_of(rng: random.Random, chars: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase + " ") for _ in range(chars))


# --- 1. one conversation, one pod; conversations spread -------------------------------------


def test_turns_of_a_conversation_stay_on_one_pod_and_conversations_spread(
        routed: Routed) -> None:
    router = routed.router()
    engines = routed.kubelet.engines_of(CHAT)
    rng = random.Random(1)
    # Four conversations on three pods of SLOTS (2) slots: any placement on two pods or more
    # leaves one pod holding no more than its slots, whose later turns must hit its cache
    # (with six, the picker's ties could place them 3/3/0 and leave nothing to check).
    conversations = [[{"role": "system", "content": text_of(rng, SYSTEM_CHARS)}]
                     for _ in range(CONVERSATIONS)]
    ids: dict[str, tuple[int, int]] = {}
    cached: dict[tuple[int, int], int] = {}
    picks_before = router_metric(router, PICKS_TOTAL, reason="endpoint_picker")
    for turn in range(3):  # turn by turn, the conversations interleaved
        for index, messages in enumerate(conversations):
            messages.append({"role": "user", "content": f"turn {turn}: {text_of(rng, 40)}"})
            request_id = rid(f"conv{index}-turn{turn}")
            answer = post(router.url, messages, request_id)
            assert answer.status_code == 200, answer.text
            ids[request_id] = (index, turn)
            cached[(index, turn)] = int(answer.json().get("timings", {}).get("cache_n", 0))
            messages.append({"role": "assistant",
                             "content": answer.json()["choices"][0]["message"]["content"]})
    served = served_by(engines, list(ids))
    pods_of: dict[int, set[str]] = {}
    for request_id, (index, _turn) in ids.items():
        pods_of.setdefault(index, set()).add(served[request_id])
    print(f"[figures] conversations by pod: {pods_of}; cache_n by (conversation, turn): "
          f"{cached}")
    assert all(len(pods) == 1 for pods in pods_of.values()), pods_of
    placement = Counter(next(iter(pods)) for pods in pods_of.values())
    # new prefixes, placed by load (the prefix scorer knows none of them yet): never all on
    # one pod
    assert len(placement) >= 2, placement
    assert router_metric(router, PICKS_TOTAL, reason="endpoint_picker") - picks_before == \
        3 * CONVERSATIONS
    # What the affinity buys: the later turns found their system prompt in the pod's cache.
    later = [cached[(i, t)] for i in range(CONVERSATIONS) for t in (1, 2)
             if placement[next(iter(pods_of[i]))] <= SLOTS]
    assert later and all(n >= SYSTEM_CHARS for n in later), cached
    # Control: the next turn of conversation 0 sent straight to another pod's gateway finds
    # nothing of it there (its cache counter discriminates).
    home = next(iter(pods_of[0]))
    other = next(e for e in engines if e.pod_name != home)
    # (its system prompt and a short turn: the whole conversation would pass the main pool's
    # context and overflow to the long-context pool, which has no address here)
    elsewhere = [conversations[0][0], {"role": "user", "content": "turn 3: elsewhere"}]
    answer = post(other.url, elsewhere, rid("conv0-elsewhere"))
    assert answer.status_code == 200, answer.text
    assert int(answer.json()["timings"]["cache_n"]) < SYSTEM_CHARS // 2, answer.json()["timings"]


# --- 2. a pod with a queue gets no new work ---------------------------------------------------


def fresh_requests(url: str, what: str, count: int, rng: random.Random) -> list[str]:
    ids = []
    for _ in range(count):
        request_id = rid(what)
        answer = post(url, [{"role": "user", "content": text_of(rng, 200)}], request_id)
        assert answer.status_code == 200, answer.text
        ids.append(request_id)
    return ids


def test_a_pod_with_a_long_queue_gets_no_new_requests(routed: Routed) -> None:
    router = routed.router()
    engines = routed.kubelet.engines_of(CHAT)
    rng = random.Random(2)
    # Control: without load, the picker's favourite pod for new prompts takes some of them.
    control = served_by(engines, fresh_requests(router.url, "idle", 9, rng))
    by_pod = Counter(control.values())
    busy_name, taken = by_pod.most_common(1)[0]
    print(f"[figures] new prompts by pod, idle: {dict(by_pod)}")
    assert taken >= 3, by_pod
    busy = next(e for e in engines if e.pod_name == busy_name)
    with QueueLoad(busy.served, clients=SLOTS + 3, max_tokens=MAIN_CONTEXT - 200) as load:
        def queued() -> float:
            return metric_sum(busy.served.gateway.metrics_text(), REQUESTS_QUEUED)
        wait_for(lambda: queued() >= 2, timeout=30, interval=0.1,
                 what=f"a queue on {busy_name}'s gateway")
        time.sleep(0.5)  # the picker scrapes every pod every 50 ms
        ids, seen = [], []
        for _ in range(9):
            ids += fresh_requests(router.url, "loaded", 1, rng)
            seen.append(queued())
        loaded = served_by(engines, ids)
    print(f"[figures] new prompts by pod, {busy_name} queued {seen}: "
          f"{dict(Counter(loaded.values()))}")
    assert min(seen) >= 1, seen  # the queue lasted the whole probe
    assert busy_name not in loaded.values(), loaded
    assert not load.failures, load.failures[:3]


# --- 4. a long prompt goes to the long-context pool -----------------------------------------


def test_a_prompt_too_long_for_the_main_pool_is_served_by_the_long_context_pool(
        routed: Routed) -> None:
    router = routed.router()
    (long_pod,) = routed.kubelet.engines_of(CHAT, "long-context")
    mains = routed.kubelet.engines_of(CHAT)
    table = routed.routes()
    assert table["mainContextTokens"] == MAIN_CONTEXT
    assert table["longContext"]["contextTokens"] == LONG_CONTEXT
    # Past the router's estimate of the main context (characters / 4), and in real tokens
    # (one a character on this model's byte vocabulary) past it too, within the long pool's.
    chars = MAIN_CONTEXT * CHARS_PER_TOKEN + 1000
    assert MAIN_CONTEXT < chars < LONG_CONTEXT - 500
    rng = random.Random(4)
    long_messages = [{"role": "user", "content": text_of(rng, chars)}]
    long_id, short_id = rid("long"), rid("short")
    answer = post(router.url, long_messages, long_id)
    assert answer.status_code == 200, answer.text
    assert answer.headers.get("x-glm-pool") == "long-context", dict(answer.headers)
    short = post(router.url, [{"role": "user", "content": "a short one"}], short_id)
    assert short.status_code == 200, short.text
    assert "x-glm-pool" not in short.headers, dict(short.headers)
    where = served_by([long_pod, *mains], [long_id, short_id])
    assert where[long_id] == long_pod.pod_name, where
    assert where[short_id] in {m.pod_name for m in mains}, where
    # Control: the main pool's engine cannot take that prompt (over its slot's context).
    direct = httpx.post(mains[0].served.engine.url + "/v1/chat/completions", timeout=60,
                        json={"messages": long_messages, "max_tokens": 4})
    assert direct.status_code == 400, (direct.status_code, direct.text[:300])


# --- 3. version weights and the pin -----------------------------------------------------------


def test_a_canary_gets_its_weight_of_requests_exactly_and_a_pin_is_exact(
        routed: Routed) -> None:
    kubectl, ns = routed.kubectl, routed.ns
    mv = copy.deepcopy(CPU_MV)
    mv["metadata"]["name"] = V2
    deploy_model(kubectl, ns, mv, wait_for)
    kubectl("patch", "glmservice", CHAT, "-n", ns, "--type=merge", "-p", json.dumps({"spec": {
        "modelVersion": V2,
        # One step held for the whole test: no Prometheus here, so the step cannot be judged
        # and holds (docs/canary.md), and its interval is longer than the module.
        "rollout": {"strategy": "canary", "steps": [CANARY_WEIGHT], "interval": "30m"}}}))

    def both() -> dict[str, int] | None:
        weights = {v["name"]: v["weight"] for v in routed.routes()["versions"]}
        return weights if weights == {V1: 100 - CANARY_WEIGHT, V2: CANARY_WEIGHT} else None
    wait_for(both, timeout=120, what="routes.json with the canary's weight")
    wait_for(lambda: len(routed.kubelet.engines_of(CHAT, version=V2)) == 1, timeout=60,
             what="the canary's pod served")
    router = routed.router()
    wait_for(lambda: httpx.get(router.url + "/readyz").json().get("versions") == [V1, V2]
             or httpx.get(router.url + "/readyz").json().get("versions") == [V2, V1],
             timeout=30, what="the router reading both versions")
    (canary,) = routed.kubelet.engines_of(CHAT, version=V2)
    stable = routed.kubelet.engines_of(CHAT, version=V1)
    assert len(stable) == 3

    def send(index: int, pin: str | None = None) -> str:
        answer = post(router.url, [{"role": "user", "content": f"hi {index}"}],
                      rid("w"), max_tokens=1, headers={"x-glm-version": pin} if pin else None)
        assert answer.status_code == 200, answer.text
        return str(answer.headers["x-glm-version"])

    canary_before = gateway_requests(canary)
    with ThreadPoolExecutor(4) as pool:
        versions = Counter(pool.map(send, range(WEIGHTED_REQUESTS)))
    share = 100 * versions[V2] / WEIGHTED_REQUESTS
    canary_got = gateway_requests(canary) - canary_before
    print(f"[figures] {WEIGHTED_REQUESTS} requests by version {dict(versions)} "
          f"({share:.1f} % canary); the canary's gateway counted {canary_got:g}")
    assert abs(share - CANARY_WEIGHT) <= 2, versions
    # The header is what the pods served: the canary's one pod took exactly those requests.
    assert canary_got == versions[V2], (canary_got, versions)

    before = gateway_requests(canary)
    with ThreadPoolExecutor(4) as pool:
        pinned_stable = Counter(pool.map(lambda i: send(i, V1), range(40)))
    assert pinned_stable == {V1: 40}, pinned_stable
    assert gateway_requests(canary) == before
    with ThreadPoolExecutor(4) as pool:
        pinned_canary = Counter(pool.map(lambda i: send(i, V2), range(40)))
    assert pinned_canary == {V2: 40}, pinned_canary
    assert gateway_requests(canary) - before == 40

    unknown = post(router.url, [{"role": "user", "content": "hi"}], rid("unknown"),
                   headers={"x-glm-version": "no-such-version"})
    assert unknown.status_code == 400, unknown.text
    error = unknown.json()["error"]
    assert error["code"] == "unknown_version" and V1 in error["message"], error


# --- 5. scale from zero -----------------------------------------------------------------------


def test_an_idle_pool_goes_to_zero_and_the_first_request_wakes_it(routed: Routed) -> None:
    kubectl, ns, kubelet = routed.kubectl, routed.ns, routed.kubelet
    table = routed.routes(SLEEPY)
    (version,) = table["versions"]
    assert version["minReplicas"] == 0 and version["activityLease"], version
    deployment = version["deployment"]

    def replicas() -> int:
        return int(kubectl.get_json("deployment", deployment, "-n", ns)["spec"]
                   .get("replicas", 0))
    wait_for(lambda: replicas() == 0 and not kubelet.engines_of(SLEEPY), timeout=180,
             what=f"the operator to put {deployment} to zero after {IDLE_SECONDS} s idle")
    asleep = time.monotonic() - routed.created
    ready = condition(kubectl.get_json("glmservice", SLEEPY, "-n", ns), "Ready")
    assert ready and ready["reason"] == "ScaledToZero", ready
    router = routed.router(SLEEPY)
    assert router_metric(router, WAKES_TOTAL) == 0
    lease_before = kubectl.get_json("lease", version["activityLease"], "-n", ns)["spec"]

    request_id = rid("wake")
    started = time.monotonic()
    # The service is Open (no keys Secret), so its router asks for no key: a request without
    # one wakes the pool (docs/routing.md). A keyed service's router would want a valid key.
    answer = post(router.url, [{"role": "user", "content": "wake up"}], request_id,
                  timeout=version["wakeTimeoutSeconds"] + 10)
    waited = time.monotonic() - started
    print(f"[figures] {SLEEPY}: at zero {asleep:.0f} s after it was created; the first "
          f"request answered {answer.status_code} after {waited:.1f} s")
    assert answer.status_code == 200, answer.text
    assert waited < 60, waited
    assert replicas() == 1
    assert router_metric(router, WAKES_TOTAL, version=version["name"]) == 1
    (woken,) = kubelet.engines_of(SLEEPY)
    assert served_by([woken], [request_id]) == {request_id: woken.pod_name}
    # The router marked the activity on the version's Lease with its own token, so the
    # operator does not put the pool back to sleep under it.
    lease = kubectl.get_json("lease", version["activityLease"], "-n", ns)["spec"]
    assert lease.get("renewTime") != lease_before.get("renewTime"), (lease_before, lease)


# --- 6. the picker down -----------------------------------------------------------------------


def test_without_the_picker_fail_open_serves_and_fail_close_refuses(routed: Routed) -> None:
    kubectl, ns, kubelet = routed.kubectl, routed.ns, routed.kubelet
    router = routed.router()
    # Every pick so far was the picker's (control for the counter below).
    assert router_metric(router, PICKS_TOTAL, reason="fail_open") == 0
    assert router_metric(router, PICKS_TOTAL, reason="endpoint_picker") > 0
    picker = kubelet.picker_of(CHAT)
    assert picker is not None
    single_before = router_metric(router, PICKS_TOTAL, reason="single")
    picker.kill()
    try:
        for index in range(5):
            answer = post(router.url, [{"role": "user", "content": f"open {index}"}],
                          rid("open"), max_tokens=1)
            assert answer.status_code == 200, answer.text
        # the canary's one pod is sent its share without asking the picker (reason single)
        opened = router_metric(router, PICKS_TOTAL, reason="fail_open")
        assert opened >= 1, opened
        assert opened + router_metric(router, PICKS_TOTAL, reason="single") - single_before == 5

        kubectl("patch", "glmservice", CHAT, "-n", ns, "--type=merge", "-p",
                json.dumps({"spec": {"routing": {"failureMode": "FailClose"}}}))

        def closed_router() -> RouterPod | None:
            routers = kubelet.routers_of(CHAT)
            if len(routers) == 1 and routers[0].pod_name != router.pod_name:
                args = routers[0].rendered
                assert args[args.index("--picker-failure-mode") + 1] == "closed", args
                return routers[0]
            return None
        closing: RouterPod = wait_for(closed_router, timeout=120,
                                      what="the router rolled with --picker-failure-mode "
                                           "closed")
        answer = post(closing.url, [{"role": "user", "content": "closed"}], rid("closed"),
                      max_tokens=1)
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "picker_unavailable", answer.text
        assert answer.headers.get("retry-after") == "1", dict(answer.headers)
    finally:
        picker = kubelet.restart_picker(CHAT)
    # Control: the same router with its picker back serves again (the 503 was the picker).
    closing = routed.router()

    def served() -> bool:
        return post(closing.url, [{"role": "user", "content": "back"}], rid("back"),
                    max_tokens=1).status_code == 200
    wait_for(served, timeout=30, what="a request served once the picker is back")
    assert not kubelet.errors, kubelet.errors


# --- 7. an operator restart does not orphan a version's Lease ---------------------------------


def test_a_restarted_operator_prunes_the_lease_of_a_switch_it_missed(routed: Routed) -> None:
    """The activity Lease is an optional child (not watched): a new operator process learns
    of the ones it owns by listing them once, or a switch made while it was down would leave
    the old one behind for good."""
    kubectl, ns = routed.kubectl, routed.ns
    (version,) = routed.routes(SLEEPY)["versions"]
    lease = version["activityLease"]
    assert kubectl.exists("lease", lease, "-n", ns)  # the control: there is one to prune
    routed.operator.stop()
    kubectl("patch", "glmservice", SLEEPY, "-n", ns, "--type=merge", "-p", json.dumps(
        {"spec": {"routing": {"mode": "Service"}, "autoscaling": {"minReplicas": 1}}}))
    restarted = OperatorProcess(kubectl, namespaces=(f"{PREFIX}*",))
    routed.operator = restarted
    try:
        wait_for(restarted.alive, timeout=60, what="the restarted operator")
        wait_for(lambda: not kubectl.exists("lease", lease, "-n", ns), timeout=60,
                 what=f"the restarted operator to delete Lease {lease}, no longer desired")
        # Only that one: the other service's long-context Lease, still desired, stays.
        assert kubectl.exists("lease", activity_lease_name(CHAT), "-n", ns)
    finally:
        restarted.stop()
