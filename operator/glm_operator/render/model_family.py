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

GLM_STOP_SEQUENCES: tuple[str, ...] = ("<|user|>", "<|observation|>", "<|endoftext|>")

# Architecture names of the GLM chat family, as GGUF headers and the fetch Job spell them
# (glm4_moe / glm4v_moe: transformers' model_type spelling of the same models).
GLM_CHAT_ARCHITECTURES = frozenset(
    {"chatglm", "glm4", "glm4moe", "glm4_moe", "glm-dsa", "glm5-next", "glm4v", "glm4v_moe"}
)

# vLLM's GLM-4.5+ tool-call and reasoning parsers (vLLM >= 0.10); older GLM-4 checkpoints
# (glm4, chatglm) use the generic chat template and get none.
VLLM_GLM45_PARSER_ARCHITECTURES = frozenset({"glm4moe", "glm4_moe", "glm-dsa", "glm4v_moe"})


def _normalise(architecture: str) -> str:
    return architecture.strip().lower()


def stop_sequences(architecture: str) -> tuple[str, ...]:
    """The stop sequences the gateway adds to every request for this architecture."""
    if _normalise(architecture) in GLM_CHAT_ARCHITECTURES:
        return GLM_STOP_SEQUENCES
    return ()


def uses_vllm_glm45_parsers(architecture: str) -> bool:
    return _normalise(architecture) in VLLM_GLM45_PARSER_ARCHITECTURES
