"""`glm-operator plan` end to end through the real CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from glm_operator.cli import main

GLM4_9B_FLAGS = [
    "plan", "--arch", "glm4", "--layers", "40", "--embd", "4096", "--heads", "32",
    "--kv-heads", "2", "--head-dim", "128", "--trained-context", "131072", "--vocab", "151552",
    "--ffn", "13696",
    "--params", "9.4", "--quantization", "Q4_K_M", "--engine", "llamacpp",
    "--accelerator", "nvidia-a10",
]


def test_plan_prints_a_table_with_verdict_and_alternatives(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main([*GLM4_9B_FLAGS, "--context", "131072", "--concurrency", "4"])
    out = capsys.readouterr().out
    assert rc == 1  # does not fit
    assert "KV cache              20.0 GiB (40960 bytes/token)" in out
    assert "DOES NOT FIT" in out and "short by 4.7 GiB" in out
    assert "- KV cache q8_0 fits with 4.7 GiB headroom" in out
    assert "--parallel            4" in out


def test_plan_json_from_a_facts_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps({
        "architecture": "glm4", "block_count": 40, "embedding_length": 4096, "head_count": 32,
        "head_count_kv": 2, "context_length": 131072, "parameter_count": 9_400_000_000,
    }))
    rc = main(["plan", "--gguf-facts", str(facts), "--quantization", "Q4_K_M", "--engine",
               "llamacpp", "--accelerator", "nvidia-a10", "--context", "32768",
               "--concurrency", "4", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0 and data["feasible"] is True
    assert data["memory"]["kvBytes"] == 5_368_709_120
    assert data["llamacpp"]["ctx_size"] == 131072


def test_plan_reports_missing_facts(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", "--arch", "glm4", "--quantization", "Q4_K_M", "--engine", "llamacpp",
               "--accelerator", "cpu"])
    assert rc == 2
    assert "model facts missing: block_count" in capsys.readouterr().err
