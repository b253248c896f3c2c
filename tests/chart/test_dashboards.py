"""Every panel of the chart's Grafana dashboards (files/dashboards/*.json, the ConfigMap of
templates/dashboard.yaml), queried on a real Prometheus (Debian's `prometheus`, through
e2e/prometheus.py) over the real series, as Grafana would query it.

The series: the real gateway process (`glm-operator gateway`) in front of a small fake engine,
answering a steady flow of chat requests (whole and streamed), and the operator's metrics as
its process serves them (tests/chart/operator_exposition.py: what `glm-operator run` imports
and serves, recorded as a leader managing one GLMService records it). Prometheus scrapes both
every second with the labels the Prometheus Operator gives the chart's ServiceMonitor (the
operator's: job, namespace, pod of the release) and the GLMService's ServiceMonitor
(honorLabels: the gateway's own `service`, `model_version`, `pool`; namespace and pod from the
target).

Each panel's query, its Grafana variables replaced as Grafana replaces them (both with "All"
selected and with the values the variable's own query offers), must return at least one
sample with a number, and every `{{label}}` of its legend must be on what it returns. A panel
that legitimately shows zero (no rollback yet, no plan failure) must show 0, not "No data".
Every panel needs a title and the dashboard's datasource; every series a panel names must be
in the real exposition, so a renamed metric fails here.

No cluster is needed. Without the prometheus binary these tests skip locally and FAIL in CI
(CI=true).
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.gateway_process import GatewayProcess
from e2e.prometheus import PrometheusServer, binary_missing_reason

HERE = Path(__file__).resolve().parent
DASHBOARD_DIR = HERE.parents[1] / "charts" / "glm-operator" / "files" / "dashboards"
DASHBOARDS = sorted(DASHBOARD_DIR.glob("*.json"))

# The operator's metrics Service of release "glm" in glm-system, as the chart's ServiceMonitor
# is scraped (no honorLabels): the Prometheus Operator's target labels.
OPERATOR_TARGET = {"job": "glm-glm-operator-metrics", "namespace": "glm-system",
                   "service": "glm-glm-operator-metrics", "endpoint": "metrics",
                   "pod": "glm-glm-operator-5d8f9c7b6-x2k4q", "container": "operator"}
# A model pod of GLMService "glm" in team-a, scraped through the operator's ServiceMonitor
# (honorLabels: the gateway's `service` label wins over the Service's name).
SERVICE_NAMESPACE = "team-a"
GLM_SERVICE = "glm"
GATEWAY_TARGET = {"job": "glm", "namespace": SERVICE_NAMESPACE, "service": "glm-endpoint",
                  "endpoint": "http", "pod": "glm-glm-4-v1-main-7c9d8b-abcde",
                  "container": "gateway"}
# The values a user picks for each query variable, besides "All".
PICKED = {"job": [OPERATOR_TARGET["job"]], "namespace": [OPERATOR_TARGET["namespace"]],
          "service_namespace": [SERVICE_NAMESPACE]}

# Grafana's built-in variables, as it would fill them in for a 1 h view of a Prometheus
# scraped every second ($__rate_interval is at least four scrape intervals).
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__interval_ms": "15000",
            "__range": "1h", "__range_s": "3600", "__range_ms": "3600000"}
# Series Prometheus makes itself for every target; they are not in any exposition.
SCRAPE_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped",
                 "scrape_samples_post_metric_relabeling", "scrape_series_added"}
NO_QUERY_PANELS = {"row", "text", "news", "dashlist"}
DATA_TIMEOUT = 40.0  # seconds for every panel to have data, after both targets are up
PASSES_WITH_STEADY_DATA = 2  # query rounds in a row a panel must pass


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


def _missing(message: str) -> None:
    if _ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


# --- the dashboards --------------------------------------------------------------------------


def _load(path: Path) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(path.read_text())
    return dashboard


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside rows (collapsed rows hold theirs) included."""
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _query_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in _panels(dashboard["panels"]) if p.get("type") not in NO_QUERY_PANELS]


def _variables(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return list(dashboard.get("templating", {}).get("list", []))


def _variable_query(variable: dict[str, Any]) -> str:
    query = variable.get("query", "")
    return str(query.get("query", "") if isinstance(query, dict) else query)


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_SELECTOR = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)\s*\{")
_VARIABLE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\[\[(\w+)(?::(\w+))?\]\]|\$(\w+)")
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(.*\S)\s*,\s*)?(\w+)\s*\)\s*$", re.S)


def _series_names(expr: str) -> set[str]:
    """Metric names of the selectors in a PromQL expression (every one has matchers: a panel
    follows the dashboard's variables)."""
    return set(_SELECTOR.findall(_STRING.sub('""', expr)))


def _regex_escape(value: str) -> str:
    """Grafana's escaping of a value put into a Prometheus regex matcher."""
    return re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\1", value)


def _formatted(variable: dict[str, Any] | None, values: list[str] | None, fmt: str | None,
               name: str) -> str:
    if variable is None:
        if name in BUILTINS:
            return BUILTINS[name]
        raise KeyError(f"${name} is not a variable of the dashboard")
    if values is None:  # "All"
        if not variable.get("includeAll"):
            raise KeyError(f"${name} has no All option")
        if variable.get("allValue") is not None and fmt in (None, "regex", "raw"):
            return str(variable["allValue"])
        raise KeyError(f"${name}: All without an allValue is not tested here")
    if fmt == "raw":
        return ",".join(values)
    escaped = [_regex_escape(v) for v in values]
    if fmt in (None, "regex"):
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
    if fmt == "pipe":
        return "|".join(values)
    raise KeyError(f"${{{name}:{fmt}}}: format not known here")


def _interpolate(text: str, dashboard: dict[str, Any], picked: dict[str, list[str]] | None
                 ) -> str:
    """`text` with Grafana's variables replaced: `picked` values (None: "All" for every
    variable), and the built-ins of BUILTINS. An unknown variable raises KeyError."""
    by_name = {v["name"]: v for v in _variables(dashboard)}

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3) or match.group(5)
        fmt = match.group(2) or match.group(4)
        variable = by_name.get(name)
        values = None if picked is None or variable is None else picked[name]
        return _formatted(variable, values, fmt, name)

    return _VARIABLE.sub(replace, text)


def _targets(dashboard: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(panel, target) for panel in _query_panels(dashboard)
            for target in panel.get("targets", []) if not target.get("hide")]


# --- the real series -------------------------------------------------------------------------

CHAT = {"model": GLM_SERVICE, "messages": [{"role": "user", "content": "hello there"}]}


class _FakeEngine(BaseHTTPRequestHandler):
    """Answers as llama-server does: /health, /props, whole answers with `usage` and streams
    whose last chunk has `timings`."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, b'{"status":"ok"}')
        elif self.path == "/props":
            self._send(200, b'{"default_generation_settings":{"n_ctx":4096},"total_slots":4}')
        else:
            self._send(404, b'{"error":{"code":404,"message":"not found"}}')

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            self._send(404, b'{"error":{"code":404,"message":"not found"}}')
        elif body.get("stream"):
            chunks = [b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n',
                      b'data: {"choices":[{"delta":{},"finish_reason":"stop"}],'
                      b'"timings":{"prompt_n":9,"cache_n":0,"predicted_n":4}}\n\n',
                      b"data: [DONE]\n\n"]
            self._send(200, b"".join(chunks), "text/event-stream")
        else:
            self._send(200, json.dumps({
                "choices": [{"message": {"role": "assistant", "content": "hi"},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 9, "completion_tokens": 3}}).encode())


def _post(url: str, body: dict[str, Any]) -> int:
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


@dataclass
class Scene:
    gateway: GatewayProcess
    operator: subprocess.Popen[str]
    operator_url: str

    def expositions(self) -> dict[str, str]:
        texts = {}
        for who, url in (("gateway", self.gateway.url), ("operator", self.operator_url)):
            with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
                texts[who] = response.read().decode()
        return texts


def _start_operator_metrics() -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen([sys.executable, str(HERE / "operator_exposition.py")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               stdin=subprocess.DEVNULL)
    assert process.stdout is not None
    line = process.stdout.readline()  # its port, once it serves
    if not line.strip().isdigit():
        process.kill()
        _, err = process.communicate(timeout=10)
        raise RuntimeError(f"operator_exposition.py did not start: {line!r}\n{err}")
    return process, f"http://127.0.0.1:{int(line)}"


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    """The gateway in front of the fake engine under a steady flow of requests, and the
    operator's metrics; both serve /metrics on 127.0.0.1."""
    engine = ThreadingHTTPServer(("127.0.0.1", 0), _FakeEngine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    operator, operator_url = _start_operator_metrics()
    gateway: GatewayProcess | None = None
    stop = threading.Event()
    traffic: threading.Thread | None = None
    try:
        gateway = GatewayProcess.start(
            f"http://127.0.0.1:{engine.server_port}", tmp_path_factory.mktemp("gateway"),
            ["--model-version", "glm-4-v1", "--pool", "main"], service_name=GLM_SERVICE)
        url = f"{gateway.url}/v1/chat/completions"
        codes: list[int] = []

        def requests() -> None:  # a client: whole answers and streams, a few a second
            while not stop.is_set():
                codes.append(_post(url, CHAT))
                codes.append(_post(url, {**CHAT, "stream": True}))
                stop.wait(0.2)

        traffic = threading.Thread(target=requests, daemon=True)
        traffic.start()
        for _ in range(100):
            if codes:
                break
            time.sleep(0.05)
        assert codes and codes[0] == 200, f"the gateway answered {codes}:\n{gateway.log_text()}"
        yield Scene(gateway, operator, operator_url)
    finally:
        stop.set()
        if traffic is not None:
            traffic.join(timeout=15)
        if gateway is not None:
            gateway.stop()
        operator.terminate()
        try:
            operator.wait(timeout=10)
        except subprocess.TimeoutExpired:
            operator.kill()
            operator.wait(timeout=10)
        engine.shutdown()
        engine.server_close()


@pytest.fixture(scope="module")
def prometheus(scene: Scene) -> Iterator[PrometheusServer]:
    """A real Prometheus scraping both every second, up on both."""
    reason = binary_missing_reason()
    if reason:
        _missing(reason)
    server = PrometheusServer().start()
    try:
        server.add_target("operator", urllib.parse.urlsplit(scene.operator_url).netloc,
                          OPERATOR_TARGET, honor_labels=False)
        server.add_target("gateway", f"127.0.0.1:{scene.gateway.port}", GATEWAY_TARGET)
        for job in (OPERATOR_TARGET["job"], GATEWAY_TARGET["job"]):
            server.wait_for_series(f'up{{job="{job}"}} == 1', timeout=30)
        yield server
    finally:
        server.stop()


def _api(server: PrometheusServer, path: str, params: dict[str, str]) -> Any:
    url = f"{server.url}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as err:
        body = json.loads(err.read() or b"{}")
    if body.get("status") != "success":
        raise AssertionError(f"Prometheus refused {params}: {body.get('errorType')}: "
                             f"{body.get('error')}")
    return body["data"]


# --- the checks ------------------------------------------------------------------------------


def _structure_problems(dashboard: dict[str, Any]) -> list[str]:
    problems = []
    datasources = {v["name"] for v in _variables(dashboard)
                   if v.get("type") == "datasource" and v.get("query") == "prometheus"}
    wanted = [{"type": "prometheus", "uid": f"${{{name}}}"} for name in datasources]
    if not wanted:
        problems.append("no Prometheus datasource variable")
    ids = [p.get("id") for p in _panels(dashboard["panels"])]
    if len(ids) != len(set(ids)):
        problems.append(f"panel ids repeat: {ids}")
    for panel in _panels(dashboard["panels"]):
        title = str(panel.get("title") or "").strip()
        if not title:
            problems.append(f"panel {panel.get('id')} has no title")
        if panel.get("type") in NO_QUERY_PANELS:
            continue
        if panel.get("datasource") not in wanted:
            problems.append(f"{title!r}: datasource {panel.get('datasource')} is not {wanted}")
        targets = panel.get("targets") or []
        if not targets:
            problems.append(f"{title!r} has no query")
        ref_ids = [t.get("refId") for t in targets]
        if len(ref_ids) != len(set(ref_ids)) or not all(ref_ids):
            problems.append(f"{title!r}: refIds {ref_ids} must be set and distinct")
        for target in targets:
            if target.get("datasource", panel.get("datasource")) != panel.get("datasource"):
                problems.append(f"{title!r} {target.get('refId')}: another datasource")
            expr = str(target.get("expr") or "")
            if not expr.strip():
                problems.append(f"{title!r} {target.get('refId')}: no expr")
            elif not _series_names(expr):
                problems.append(f"{title!r} {target.get('refId')}: no series selector")
            try:
                _interpolate(expr, dashboard, None)
            except KeyError as err:
                problems.append(f"{title!r} {target.get('refId')}: {err.args[0]}")
    return problems


def _unknown_series(dashboard: dict[str, Any], exposed: set[str]) -> list[str]:
    queries = [(f"{panel['title']!r} {target['refId']}", str(target["expr"]))
               for panel, target in _targets(dashboard)]
    queries += [(f"variable ${v['name']}", _variable_query(v)) for v in _variables(dashboard)
                if v.get("type") == "query"]
    return [f"{where}: {name}" for where, expr in queries
            for name in sorted(_series_names(expr)) if name not in exposed | SCRAPE_SERIES]


# The series names a metric family of each type declares (a labelled metric none of whose
# label sets was created yet has its HELP and TYPE lines but no sample).
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": (
    "_bucket", "_sum", "_count", "_created"), "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",), "stateset": ("",), "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "unknown": ("",)}


def _exposed_names(texts: dict[str, str]) -> set[str]:
    """Every series name the expositions declare or carry."""
    names: set[str] = set()
    for text in texts.values():
        for family in text_string_to_metric_families(text):
            names.update(family.name + suffix for suffix in SUFFIXES[family.type])
            names.update(sample.name for sample in family.samples)
    return names


def _no_data(server: PrometheusServer, dashboard: dict[str, Any],
             picked: dict[str, list[str]] | None) -> dict[str, str]:
    """Panel query -> why it shows no data; empty when each returns a number, with every
    label its legend names."""
    failing = {}
    for panel, target in _targets(dashboard):
        where = f"{panel['title']!r} {target['refId']}"
        query = _interpolate(str(target["expr"]), dashboard, picked)
        data = _api(server, "/api/v1/query", {"query": query})
        result = data["result"] if data["resultType"] == "vector" else [
            {"metric": {}, "value": data["result"]}]
        values = [float(item["value"][1]) for item in result]
        legend = _LEGEND.findall(str(target.get("legendFormat", "")))
        missing = sorted({label for item in result for label in legend
                          if label not in item["metric"]})
        if not any(math.isfinite(v) for v in values):
            failing[where] = f"{query} -> {result or 'no series'}"
        elif missing:
            failing[where] = f"{query}: the legend's {missing} are not on {result}"
    return failing


def _wait_for_data(server: PrometheusServer, dashboard: dict[str, Any],
                   picked: dict[str, list[str]] | None, timeout: float) -> dict[str, str]:
    """Query every panel until each has passed PASSES_WITH_STEADY_DATA rounds in a row (rates
    need two scrapes), or `timeout`: what still fails then."""
    deadline = time.monotonic() + timeout
    passes = 0
    while True:
        failing = _no_data(server, dashboard, picked)
        passes = 0 if failing else passes + 1
        if passes >= PASSES_WITH_STEADY_DATA or time.monotonic() >= deadline:
            return failing
        time.sleep(1.0)


# --- the tests -------------------------------------------------------------------------------


def test_the_chart_ships_dashboards() -> None:
    assert DASHBOARDS, f"no dashboard under {DASHBOARD_DIR}"
    template = (HERE.parents[1] / "charts" / "glm-operator" / "templates"
                / "dashboard.yaml").read_text()
    for path in DASHBOARDS:
        assert f'"files/dashboards/{path.name}"' in template, f"{path.name} is not rendered"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_panel_has_a_title_the_datasource_and_queries(path: Path) -> None:
    assert _structure_problems(_load(path)) == []


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_series_a_panel_names_is_in_the_real_exposition(path: Path, scene: Scene
                                                              ) -> None:
    exposed = _exposed_names(scene.expositions())
    assert _unknown_series(_load(path), exposed) == []


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_variable_offers_the_real_values(path: Path, prometheus: PrometheusServer
                                               ) -> None:
    """A query variable's `label_values(...)` (Grafana asks /api/v1/label/<name>/values),
    with the variables it depends on at "All" and at the picked values, offers the picked
    value."""
    dashboard = _load(path)
    for picked in (None, PICKED):
        for variable in _variables(dashboard):
            if variable.get("type") != "query":
                continue
            match = _LABEL_VALUES.match(_variable_query(variable))
            assert match, f"${variable['name']}: only label_values() is understood here"
            selector, label = match.groups()
            params = {"match[]": _interpolate(selector, dashboard, picked)} if selector else {}
            offered = _api(prometheus, f"/api/v1/label/{label}/values", params)
            assert set(PICKED[variable["name"]]) <= set(offered), (variable["name"], offered)


@pytest.mark.parametrize("picked", [None, PICKED], ids=["all", "picked"])
@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_panel_shows_data_from_the_real_series(path: Path, picked: Any,
                                                     prometheus: PrometheusServer) -> None:
    failing = _wait_for_data(prometheus, _load(path), picked, DATA_TIMEOUT)
    assert failing == {}, "panels with no data:\n" + "\n".join(
        f"  {where}: {why}" for where, why in failing.items())


def test_a_renamed_metric_is_caught(scene: Scene, prometheus: PrometheusServer) -> None:
    """The harness itself: a panel whose series was renamed fails both the exposition check
    and the data check."""
    dashboard = copy.deepcopy(_load(DASHBOARDS[0]))
    panel, target = _targets(dashboard)[0]
    (name, *_) = sorted(_series_names(target["expr"]) - SCRAPE_SERIES)
    target["expr"] = target["expr"].replace(name, name + "_renamed")
    exposed = _exposed_names(scene.expositions())
    assert _unknown_series(dashboard, exposed) == [
        f"{panel['title']!r} {target['refId']}: {name}_renamed"]
    assert f"{panel['title']!r} {target['refId']}" in _no_data(prometheus, dashboard, PICKED)
