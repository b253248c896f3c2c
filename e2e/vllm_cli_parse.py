"""Run argvs through vLLM's own `vllm` command line, up to the point where it would serve.

Executed by the Python of the pinned vLLM's venv (e2e/vllm_cli.py), never imported by the
tests. stdin: a JSON object {case: argv}, each argv starting with `vllm serve`. For each case
this sets sys.argv and calls vLLM's real `vllm.entrypoints.cli.main.main()`: its parser for
every subcommand, the `serve` subcommand's `validate_parsed_serve_args`, then, where the serve
command would start, builds `AsyncEngineArgs.from_cli_args(args)` (what `vllm serve` hands
to the engine) instead of loading a model. stdout: a JSON object {case: result} with
`ok`, the error (argparse's message or the exception) and the engine arguments' fields.
An argv starting with `ray` (a group's Ray head and workers) goes through Ray's own command
line instead.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import sys
import tempfile
from typing import Any

import vllm
import vllm.entrypoints.cli.serve as serve
import vllm.platforms
from vllm.entrypoints.cli.main import main
from vllm.entrypoints.openai.api_server import validate_api_server_args
from vllm.platforms.cpu import CpuPlatform

RESULT_MARK = "VLLM_CLI_PARSE_RESULT "

SERVE_OPTIONS: set[str] = set()


class Served(Exception):
    """Raised where `vllm serve` would start serving: the argv got through."""

    def __init__(self, fields: dict[str, Any]) -> None:
        super().__init__("served")
        self.fields = fields


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return repr(value)


def _capture(args: argparse.Namespace) -> None:
    # ServeSubcommand.cmd's first step, the API server's own checks of its arguments (tool
    # and reasoning parser names among them), then the engine arguments built from args.
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag
    validate_api_server_args(args)
    engine_args = vllm.AsyncEngineArgs.from_cli_args(args)
    if getattr(engine_args, "reasoning_parser", None):
        # vLLM 0.33 keeps --reasoning-parser out of the API server's check (it reads the
        # structured-outputs copy, filled later); the engine resolves the name when it starts,
        # as here, and a name it does not know stops it.
        from vllm.reasoning import ReasoningParserManager
        ReasoningParserManager.get_reasoning_parser(engine_args.reasoning_parser)
    fields = {f.name: _plain(getattr(engine_args, f.name)) for f in dataclasses.fields(engine_args)}
    raise Served({"engine_args": fields, "namespace": _plain(vars(args))})


def _remember_options(original: Any) -> Any:
    def subparser_init(self: Any, subparsers: Any) -> Any:
        parser = original(self, subparsers)
        for action in parser._actions:
            SERVE_OPTIONS.update(o for o in action.option_strings if o.startswith("--"))
        return parser
    return subparser_init


def run_ray(argv: list[str]) -> dict[str, Any]:
    """`ray ...` through Ray's own click command line (the Ray vLLM installs), parsed into the
    subcommand's parameters without running it."""
    import click
    from ray.scripts.scripts import cli

    try:
        with cli.make_context("ray", list(argv[1:])) as group:
            name, command, rest = cli.resolve_command(group, group.protected_args + group.args)
            assert command is not None
            with command.make_context(name or "", rest, parent=group) as sub:
                return {"ok": True, "namespace": _plain(sub.params)}
    except click.ClickException as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc.format_message()}"}


def run(argv: list[str], model_dir: str) -> dict[str, Any]:
    if argv[:1] == ["ray"]:
        return run_ray(argv)
    # The model path is the pod's volume mount; here an empty directory stands where it is
    # mounted (vLLM looks a path that does not exist up on the Hugging Face hub).
    sys.argv = [*argv[:2], model_dir, *argv[3:]]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            main()
    except Served as served:
        return {"ok": True, **served.fields}
    except SystemExit as exc:
        return {"ok": False, "error": f"exit {exc.code}: {err.getvalue().strip()[-2000:]}"}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": False, "error": "vllm's main returned without reaching `serve`"}


def entry() -> None:
    # vLLM picks its platform by probing the hardware (NVML, libcuda, torch_npu) and refuses
    # to build its parser on none; here it is given its CPU platform. The flags and their
    # parsing are the same on every platform; what differs is create_engine_config(), which
    # this does not reach.
    vllm.platforms._current_platform = CpuPlatform()
    serve.ServeSubcommand.cmd = staticmethod(_capture)  # type: ignore[method-assign]
    serve.ServeSubcommand.subparser_init = _remember_options(  # type: ignore[method-assign]
        serve.ServeSubcommand.subparser_init)
    cases: dict[str, list[str]] = json.load(sys.stdin)
    with tempfile.TemporaryDirectory(prefix="vllm-model-") as model_dir:
        results = {name: run(argv, model_dir) for name, argv in cases.items()}
    # vLLM logs to stdout: the result is the one line that carries the mark.
    print(RESULT_MARK + json.dumps({"vllm": vllm.__version__, "model_dir": model_dir,
                                    "serve_options": sorted(SERVE_OPTIONS),
                                    "results": results}), flush=True)


if __name__ == "__main__":
    entry()
