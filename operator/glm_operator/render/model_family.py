"""What the renderer derives from a model's architecture name (GGUF `general.architecture`,
or the same name the fetch Job maps config.json's class to): one table per fact, here only.

GLM chat templates (ChatGLM3, GLM-4, GLM-4.5/4.6/4.7, GLM-5) mark turns with role tokens:
`[gMASK]<sop><|system|>...<|user|>...<|assistant|>...<|observation|>` (a tool result). A
reply ends where the model would start the next turn, so `<|user|>` and `<|observation|>`
are stop sequences, with `<|endoftext|>` (GLM-4's eos); they are the stop token ids GLM's
own generation config and examples give (eos, `<|user|>`, `<|observation|>`). llama.cpp
marks only some of them end-of-generation, depending on how the GGUF was converted, and a
model served without its template's stops runs on into an invented next turn: the gateway
adds them to every request. Other families (llama, qwen, ...) end on their eos token, which
the engines already honour: no stops.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

GLM_STOP_SEQUENCES: tuple[str, ...] = ("<|user|>", "<|observation|>", "<|endoftext|>")

# Architecture names of the GLM chat family, as GGUF headers and the fetch Job spell them
# (glm4_moe / glm4v_moe: transformers' model_type spelling of the same models).
GLM_CHAT_ARCHITECTURES = frozenset(
    {"chatglm", "glm4", "glm4moe", "glm4_moe", "glm-dsa", "glm5-next", "glm4v", "glm4v_moe"}
)

# vLLM's GLM tool-call and reasoning parsers. GLM-4.5 and GLM-4.6 (glm4moe) call tools with
# `glm45`; GLM-4.7, GLM-5 and GLM-5.1 with `glm47` (GLM-4.7 is still glm4moe, told apart by
# its name: the ModelVersion's source or name); all of them reason with `glm45`. Older GLM-4
# checkpoints (glm4, chatglm) use the generic chat template and get none.
VLLM_GLM45_PARSER_ARCHITECTURES = frozenset({"glm4moe", "glm4_moe", "glm4v_moe"})
VLLM_GLM47_PARSER_ARCHITECTURES = frozenset({"glm-dsa", "glm5-next"})
VLLM_GLM_REASONING_PARSER = "glm45"
# "GLM-4.7", "glm_4.7", "GLM4.7-FP8", "glm-47": the generation a name gives.
_GLM_GENERATION = re.compile(r"glm[-_ ]?(\d)(?:[._-]?(\d))?", re.IGNORECASE)


def _normalise(architecture: str) -> str:
    return architecture.strip().lower()


def stop_sequences(architecture: str) -> tuple[str, ...]:
    """The stop sequences the gateway adds to every request for this architecture."""
    if _normalise(architecture) in GLM_CHAT_ARCHITECTURES:
        return GLM_STOP_SEQUENCES
    return ()


def glm_generation(names: Iterable[str]) -> tuple[int, int] | None:
    """(major, minor) of the first name that says it (`zai-org/GLM-4.7-FP8` -> (4, 7))."""
    for name in names:
        found = _GLM_GENERATION.search(name or "")
        if found:
            return int(found.group(1)), int(found.group(2) or 0)
    return None


@dataclass(frozen=True)
class VllmParsers:
    tool_call: str | None  # --tool-call-parser (with --enable-auto-tool-choice); None: off
    reasoning: str | None  # --reasoning-parser; None: off


def vllm_parsers(architecture: str, names: Iterable[str] = (),
                 tool_call: str | None = None, reasoning: str | None = None) -> VllmParsers:
    """The parsers for a model: `tool_call`/`reasoning` as the GLMService overrides them
    ("none": off), else derived from the architecture and, for glm4moe, the generation its
    `names` give (the ModelVersion's source and name)."""
    arch = _normalise(architecture)
    derived_tool: str | None = None
    if arch in VLLM_GLM47_PARSER_ARCHITECTURES:
        derived_tool = "glm47"
    elif arch in VLLM_GLM45_PARSER_ARCHITECTURES:
        generation = glm_generation(names)
        derived_tool = "glm47" if generation is not None and generation >= (4, 7) else "glm45"
    derived_reasoning = VLLM_GLM_REASONING_PARSER if derived_tool else None

    def chosen(override: str | None, derived: str | None) -> str | None:
        if override is None:
            return derived
        return None if override == "none" else override

    return VllmParsers(chosen(tool_call, derived_tool), chosen(reasoning, derived_reasoning))
