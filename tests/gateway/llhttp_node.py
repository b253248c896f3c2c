"""Node's llhttp as a differential reader for the relay's framing tests
(test_chunk_grammar.py, test_response_head.py): one Node process reads a whole batch of raw
messages with one of the `llhttp_*verdict.js` scripts beside this file.

Node (20 or later, llhttp 9) is required where CI=true; elsewhere its absence is recorded
and the test that asked reports itself skipped at its end (`skip_without_node`), its
httptools half having run.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).parent
NODE_MISSING: list[str] = []


@dataclass(frozen=True, slots=True)
class Verdict:
    # "accept", "accept-early" (the body ended before its bytes did), "refuse", "incomplete"
    kind: str
    body: bytes = b""


def _without_node(message: str) -> None:
    """Where CI=true a missing Node fails the test; elsewhere the test goes on with
    httptools' verdicts alone and is reported skipped at its end, saying why."""
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    NODE_MISSING.append(message)


def skip_without_node() -> None:
    if NODE_MISSING:
        pytest.skip(NODE_MISSING.pop() + " (httptools' llhttp verdicts were)")


def node_verdicts(script: str, messages: list[bytes]) -> list[Verdict] | None:
    """Node's llhttp on each message, through `script` (a file beside this one), in one Node
    process (llhttp 9 or later); None where there is no such Node, outside CI."""
    node = shutil.which("node")
    if node is None:
        _without_node("node is not installed: llhttp's verdicts through Node were not checked")
        return None
    done = subprocess.run(
        [node, str(HERE / script)], capture_output=True, check=True, timeout=120,
        input=json.dumps([base64.b64encode(m).decode() for m in messages]).encode())
    answer = json.loads(done.stdout)
    if int(answer["llhttp"].split(".")[0]) < 9:
        _without_node(f"Node {answer['node']} parses with llhttp {answer['llhttp']}: "
                      "the verdicts here are llhttp 9's (Node 20 or later)")
        return None
    verdicts = []
    for verdict in answer["verdicts"]:
        assert verdict["verdict"] != "none", f"Node gave no verdict ({answer['node']})"
        verdicts.append(Verdict(verdict["verdict"], base64.b64decode(verdict.get("body", ""))))
    return verdicts
