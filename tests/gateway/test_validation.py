"""Request parsing: every rejection is a 400 naming the field; accepted bytes pass unchanged."""

from __future__ import annotations

import json
from typing import Any

import pytest
from glm_operator.gateway.openai.errors import GatewayError
from glm_operator.gateway.openai.validation import merge_stop, parse_request
from hypothesis import given, settings
from hypothesis import strategies as st

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def chat(**fields: Any) -> bytes:
    return json.dumps({**CHAT, **fields}).encode()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat(temperature=2.5), "temperature"),
        (chat(temperature=-0.1), "temperature"),
        (chat(temperature="hot"), "temperature"),
        (chat(temperature=True), "temperature"),
        (chat(top_p=1.5), "top_p"),
        (chat(temperature=float("nan")), "temperature"),
        (chat(top_p=float("inf")), "top_p"),
        (chat(max_tokens=0), "max_tokens"),
        (chat(max_tokens=1.5), "max_tokens"),
        (chat(max_completion_tokens=-3), "max_completion_tokens"),
        (chat(n=2), "n"),
        (chat(n="1"), "n"),
        (chat(stream="yes"), "stream"),
        (chat(stream=1), "stream"),
        (chat(stream_options={"include_usage": True}), "stream_options"),
        (chat(presence_penalty=3), "presence_penalty"),
        (chat(frequency_penalty=-2.01), "frequency_penalty"),
        (chat(stop=5), "stop"),
        (chat(stop=["ok", 3]), "stop[1]"),
        (chat(stop=[""]), "stop[0]"),
        (chat(model=7), "model"),
        (chat(messages=[]), "messages"),
        (chat(messages="hi"), "messages"),
        (chat(messages=["hi"]), "messages[0]"),
        (chat(messages=[{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]),
         "messages[1].role"),
        (chat(messages=[{"role": "user"}]), "messages[0].content"),
        (chat(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
        (chat(messages=[{"role": "user", "content": [{"text": "x"}]}]),
         "messages[0].content[0].type"),
        (json.dumps({"model": "m"}).encode(), "messages"),
    ],
)
def test_bad_chat_fields_are_named(body: bytes, param: str) -> None:
    with pytest.raises(GatewayError) as caught:
        parse_request(body, "chat")
    assert caught.value.status == 400
    assert caught.value.param == param
    assert param.split("[")[0].split(".")[0] in caught.value.message


@pytest.mark.parametrize("body", [b"", b"{", b"[1, 2]", b'"text"', b"\xff\xfe", b"null"])
def test_malformed_json_is_400(body: bytes) -> None:
    with pytest.raises(GatewayError) as caught:
        parse_request(body, "chat")
    assert caught.value.status == 400
    assert caught.value.code == "invalid_json"


GOOD_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(("body", "said"), [
    (b"\xef\xbb\xbf" + json.dumps(GOOD_CHAT).encode(), "byte order mark"),
    (json.dumps(GOOD_CHAT).encode("utf-16"), "utf-8"),
    (json.dumps(GOOD_CHAT).encode("utf-16-le"), "send utf-8"),
    (json.dumps(GOOD_CHAT).encode("utf-32-le"), "send utf-8"),
    (b'{"model": "m", "temperature": NaN, "messages": [{"role": "user", "content": "x"}]}',
     "temperature: NaN and Infinity are not JSON"),
    (b'{"model": "m", "top_p": -Infinity, "messages": [{"role": "user", "content": "x"}]}',
     "top_p: NaN and Infinity are not JSON"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
     "messages[0].content: a lone surrogate"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "\\udc00"}]}',
     "lone surrogate"),
    (b'{"model": "m", "x\\ud83d": 1, "messages": [{"role": "user", "content": "x"}]}',
     "lone surrogate"),
])
def test_json_engines_may_refuse_is_400_saying_why(body: bytes, said: str) -> None:
    """What Python's json takes and an engine's parser may not (I-JSON, RFC 7493)."""
    json.loads(body)  # the control: Python's own parser takes every one of these
    with pytest.raises(GatewayError) as caught:
        parse_request(body, "chat")
    assert caught.value.status == 400 and caught.value.code == "invalid_json"
    assert said.lower() in caught.value.message.lower()


def test_a_surrogate_pair_and_an_escaped_backslash_are_fine() -> None:
    body = (b'{"model": "m", "messages": [{"role": "user", '
            b'"content": "\\ud83d\\ude00 and \\\\ud800 as text"}]}')
    assert json.loads(body)["messages"][0]["content"] == "\U0001F600 and \\ud800 as text"
    assert parse_request(body, "chat").body == body


@pytest.mark.parametrize("prompt", [None, 3, [], [1, "a"], [[]], {"text": "x"}])
def test_bad_completion_prompt(prompt: Any) -> None:
    body = json.dumps({"model": "m", **({} if prompt is None else {"prompt": prompt})}).encode()
    with pytest.raises(GatewayError) as caught:
        parse_request(body, "completions")
    assert caught.value.param == "prompt"


@pytest.mark.parametrize("prompt", ["hello", ["a", "b"], [1, 2, 3], [[1, 2], [3]]])
def test_good_completion_prompt(prompt: Any) -> None:
    parsed = parse_request(json.dumps({"prompt": prompt}).encode(), "completions",
                           keep_prompt=True)
    assert parsed.prompt == prompt


def test_valid_body_passes_through_byte_for_byte() -> None:
    body = chat(temperature=0.7, top_p=0.9, max_tokens=16, stream=True, n=1, top_k=40,
                stream_options={"include_usage": True}, ignore_eos=True)
    parsed = parse_request(body, "chat")
    assert parsed.body is body
    assert parsed.stream is True


def test_only_the_fields_the_pipeline_needs_outlive_the_parse() -> None:
    parsed = parse_request(chat(max_completion_tokens=7), "chat")
    assert (parsed.max_tokens, parsed.prompt, parsed.stream) == (7, None, False)
    assert not hasattr(parsed, "payload") and not hasattr(parsed, "__dict__")
    kept = parse_request(chat(max_tokens=3, max_completion_tokens=7), "chat", keep_prompt=True)
    assert kept.max_tokens == 3 and kept.prompt == json.loads(chat())["messages"]


def test_model_stop_sequences_are_added_after_the_clients() -> None:
    parsed = parse_request(chat(stop="END"), "chat", ("<|user|>", "END"))
    assert json.loads(parsed.body)["stop"] == ["END", "<|user|>"]
    parsed = parse_request(chat(), "chat", ("<|user|>",))
    assert json.loads(parsed.body)["stop"] == ["<|user|>"]


@pytest.mark.parametrize("named", ["glm-5", "zai-org/GLM-5.1", "", None])
def test_the_engine_gets_the_name_it_serves_whatever_the_client_names(named: str | None) -> None:
    body = {**CHAT, "model": named} if named is not None else \
        {"messages": CHAT["messages"]}
    parsed = parse_request(json.dumps(body).encode(), "chat", ("<|user|>",),
                           served_model="chat-prod")
    sent = json.loads(parsed.body)
    assert sent["model"] == "chat-prod" and sent["stop"] == ["<|user|>"]
    assert sent["messages"] == CHAT["messages"]
    completion = parse_request(json.dumps({"model": named, "prompt": "x"}).encode(),
                               "completions", served_model="chat-prod")
    assert json.loads(completion.body)["model"] == "chat-prod"


def test_a_request_naming_the_served_model_keeps_its_bytes() -> None:
    body = chat(model="chat-prod")
    assert parse_request(body, "chat", served_model="chat-prod").body is body


def test_merge_stop() -> None:
    assert merge_stop(None, ("a",)) == ["a"]
    assert merge_stop(["a", "b"], ("b", "c")) == ["a", "b", "c"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
fields = st.sampled_from(["model", "messages", "prompt", "temperature", "top_p", "max_tokens",
                          "n", "stream", "stop", "stream_options", "seed", "top_logprobs",
                          "presence_penalty", "max_completion_tokens", "extra"])
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "bogus", 3])},
    optional={"content": json_values},
)
payloads = st.dictionaries(fields, json_values, max_size=8) | st.builds(
    lambda msgs, extra: {"messages": msgs, **extra},
    st.lists(message, max_size=3), st.dictionaries(fields, json_values, max_size=4),
)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_bytes_only_ever_give_400(body: bytes) -> None:
    for endpoint in ("chat", "completions"):
        try:
            parse_request(body, endpoint)  # type: ignore[arg-type]
        except GatewayError as err:
            assert err.status == 400


@settings(max_examples=300, deadline=None)
@given(payloads, st.sampled_from(["chat", "completions"]))
def test_fuzz_payloads_accept_or_name_a_field(payload: dict[str, Any], endpoint: str) -> None:
    body = json.dumps(payload).encode()
    try:
        parsed = parse_request(body, endpoint, ("STOP",))  # type: ignore[arg-type]
    except GatewayError as err:
        assert err.status == 400
        assert err.param or err.code == "invalid_json"
        assert json.loads(err.body())["error"]["message"]
        return
    # Accepted: what goes to the engine is valid JSON, carries the model stop and the
    # client's fields unchanged.
    sent = json.loads(parsed.body)
    assert "STOP" in sent["stop"]
    for key, value in payload.items():
        if key != "stop":
            assert sent[key] == value
