"""The `glm-operator` command.

Each subcommand lives next to the code it drives and exposes two functions:
`add_arguments(parser)` and `run(args) -> int`. They are imported only when chosen, so
`glm-operator plan` never imports kopf and the gateway never imports the planner.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from glm_operator import __version__

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("glm_operator.controllers.cli", "run the operator (kopf) against the current cluster"),
    "render": ("glm_operator.render_command",
               "print every object the operator would create, offline"),
    "plan": ("glm_operator.planning.cli", "print the capacity plan for a GLMService, offline"),
    "convert": ("glm_operator.convert_command",
                "rewrite GLMService and ModelVersion manifests at another API version"),
    "images": ("glm_operator.images", "list every image the operator may run, for a mirror"),
    "crds": ("glm_operator.generate", "regenerate the CRD YAML and API reference from the types"),
    "fetch": ("glm_operator.fetch.cli", "download and verify a model artifact (the fetch Job)"),
    "gateway": ("glm_operator.gateway.cli", "run the OpenAI-compatible gateway sidecar"),
    "router": ("glm_operator.router.cli",
               "run the LLM-aware router in front of a service's pools"),
    "wait-tcp": ("glm_operator.wait_tcp", "wait until HOST:PORT addresses accept connections"),
}

# (subcommand, flag) -> the subcommand it names: `gateway --router` is the router's first name,
# still in the arguments of router pods that older operators rendered.
ALIASES: dict[tuple[str, str], str] = {("gateway", "--router"): "router"}


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="glm-operator", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"glm-operator {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in args_list if a in SUBCOMMANDS), None)
    for name, (_, help_text) in SUBCOMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            target = next((to for (alias, flag), to in ALIASES.items()
                           if alias == name and flag in args_list), name)
            module = importlib.import_module(SUBCOMMANDS[target][0])
            module.add_arguments(command_parser)
            command_parser.set_defaults(_run=module.run)
    args = parser.parse_args(args_list)
    result: int = args._run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
