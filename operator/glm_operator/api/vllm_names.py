"""Names the pinned vLLM (0.33.0) registers, for the GLMService fields that choose among them.

vLLM refuses to start on a tool-call or reasoning parser it does not know, so the CRD lists
exactly the pinned vLLM's own (`ToolParserManager`, `ReasoningParserManager`), and the API
server refuses any other name. e2e/test_engine_architectures.py holds these lists to the
pinned vLLM's registries, so a vLLM bump that drops or adds one fails there.
"""

from __future__ import annotations

VLLM_TOOL_CALL_PARSERS: tuple[str, ...] = (
    "apertus", "beam", "cohere_command3", "cohere_command4", "deepseek_v3", "deepseek_v31",
    "deepseek_v32", "deepseek_v4", "deepseek_v41", "dots", "ernie45", "functiongemma", "gemma4",
    "gigachat3", "glm45", "glm47", "granite", "granite-20b-fc", "granite4", "hermes", "hf",
    "hunyuan_a13b", "hy_v3", "hy_v4", "inkling", "internlm", "jamba", "k2_horizon", "kimi_k2",
    "kimi_k3", "lfm2", "ling3", "llama3_json", "llama4_json", "llama4_pythonic", "longcat",
    "mimo", "minicpm5", "minimax_m2", "minimax_m3", "mistral", "muse", "muse_glimmer",
    "musespark1x", "olmo3", "openai", "phi4_mini_json", "plamo3", "poolside_v1", "pythonic",
    "qwen3_coder", "qwen3_json", "qwen3_xml", "seed_oss", "step3", "step3p5", "step5", "xlam",
)  # fmt: skip
VLLM_REASONING_PARSERS: tuple[str, ...] = (
    "beam", "cohere_command3", "cohere_command4", "deepseek_r1", "deepseek_v3", "deepseek_v4",
    "deepseek_v41", "ernie45", "gemma4", "glm45", "glm47", "granite", "granite_thinking_parser",
    "hf", "holo2", "hunyuan_a13b", "hy_v3", "hy_v4", "inkling", "k2_horizon", "kimi_k2",
    "kimi_k3", "ling3", "mimo", "minicpmv", "minimax_m2", "minimax_m2_append_think",
    "minimax_m3", "mistral", "muse", "muse_glimmer", "musespark1x", "nemotron_v3", "olmo3",
    "openai_gptoss", "plamo3", "poolside_v1", "qwen3", "seed_oss", "step3", "step3p5", "step5",
)  # fmt: skip
NO_PARSER = "none"  # turns the operator's derived parser off
