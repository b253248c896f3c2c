"""The relay's reading of an engine's response head (wire/framing.py response_head) against
llhttp, differentially, as test_chunk_grammar.py does for chunked bodies.

Each answer here (a head, then a 15-byte body that is a valid chunked body of "hello") goes
to three readers: ours (response_head, then the framing it chose), httptools' llhttp in
this process, and Node's llhttp (tests/gateway/llhttp_head_verdict.js, one Node process a
batch), and ours must agree with each llhttp's verdict (accept with which body, or
refuse), but for the cases listed in `STRICTER`, where ours refuses what llhttp takes, and
`LENIENT`, the one case where ours takes what llhttp refuses (a Content-Length repeated
with one value, which RFC 9110 section 8.6 allows; harmless here, since the gateway frames
the client's body itself and the engine's Content-Length never reaches the client). Every
Content-Length drawn announces the body's 15 bytes, so that no reader sees bytes after a
body (a second response, to llhttp) and a length and a chunked framing still differ in the
body handed out.

Node is required where CI=true, as in test_chunk_grammar.py; elsewhere its absence skips
the Node half with a reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import httptools
import pytest
from glm_operator.gateway.wire.framing import (
    MAX_HEAD_BYTES,
    ChunkedBody,
    EngineProtocolError,
    response_head,
)
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from .llhttp_node import Verdict, node_verdicts, skip_without_node

NODE_SCRIPT = "llhttp_head_verdict.js"
BODY = b"5\r\nhello\r\n0\r\n\r\n"
REFUSED = Verdict("refuse")


def ours(answer: bytes) -> Verdict:
    """What the relay makes of `answer`: its head read by response_head, its body followed
    by the framing the head chose (to the end of the bytes, where it chose none)."""
    end = answer.find(b"\r\n\r\n")
    assert end >= 0
    try:
        head = response_head(answer[:end])
        rest = answer[end + 4:]
        if head.chunked:
            chunked, out = ChunkedBody(), list[bytes]()
            used = chunked.feed(rest, out)
            if not chunked.complete or used != len(rest):
                return Verdict("incomplete")
            return Verdict("accept", b"".join(out))
    except EngineProtocolError:
        return REFUSED
    if head.length is not None:
        return Verdict("accept", rest[:head.length]) if len(rest) == head.length \
            else Verdict("incomplete")
    return Verdict("accept", rest)


class _Collect:
    def __init__(self) -> None:
        self.body = bytearray()
        self.done = False
        self.head = False

    def on_headers_complete(self) -> None:
        self.head = True

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.done = True


def httptools_verdict(answer: bytes) -> Verdict:
    """llhttp's, in this process; an answer whose head gave no length is taken whole (the
    connection's end would end it: httptools has no call for that)."""
    seen = _Collect()
    try:
        httptools.HttpResponseParser(seen).feed_data(answer)
    except httptools.HttpParserError:
        return REFUSED
    if seen.done or seen.head:
        return Verdict("accept", bytes(seen.body))
    return Verdict("incomplete")


# --- where ours and llhttp differ, on purpose ------------------------------------------------

_STRICT_STATUS = re.compile(rb"HTTP/1\.[01] [1-5][0-9][0-9](?: [\t \x21-\x7e\x80-\xff]*)?")


def _fields(head: bytes, name: bytes) -> list[bytes]:
    return [line.split(b":", 1)[1].strip(b" \t") for line in head.split(b"\r\n")[1:]
            if line.lower().startswith(name + b":")]


def _codings(head: bytes) -> list[bytes]:
    return [c.strip(b" \t").lower() for v in _fields(head, b"transfer-encoding")
            for c in v.split(b",")]


# Where ours refuses an answer llhttp takes: why, and the test of its head.
STRICTER: dict[str, Callable[[bytes], bool]] = {
    # llhttp takes `gzip, chunked` as chunked (the gzip left to the client, whose head the
    # gateway writes without it), `chunked, chunked` as chunked (RFC 9112 6.1 forbids it),
    # and any other coding as a body to the connection's end.
    "a Transfer-Encoding other than chunked once": lambda head: (
        bool(_codings(head)) and _codings(head) != [b"chunked"]),
    # RFC 9110 5.6.3: OWS may be a tab; llhttp reads `chunked<TAB>` as some other coding
    # (a body to the connection's end), ours refuses it rather than take it as chunked.
    "a Transfer-Encoding ending with a tab": lambda head: any(
        re.search(rb"\t[ \t]*$", line) for line in head.split(b"\r\n")[1:]
        if line.lower().startswith(b"transfer-encoding:")),
    # llhttp takes `HTTP/2.0`, any three digits, and control bytes in the reason phrase.
    "a status line RFC 9112 does not allow": lambda head: (
        _STRICT_STATUS.fullmatch(head.split(b"\r\n", 1)[0]) is None),
}
# Where ours takes an answer llhttp refuses.
LENIENT: dict[str, Callable[[bytes], bool]] = {
    # RFC 9110 8.6; llhttp refuses a second Content-Length line and a list alike.
    "a Content-Length repeated with one value": lambda head: (
        len([v for f in _fields(head, b"content-length") for v in f.split(b",")]) > 1),
}


def why_differs(head: bytes, table: dict[str, Callable[[bytes], bool]]) -> str | None:
    return next((why for why, test in table.items() if test(head)), None)


# --- the answers ---------------------------------------------------------------------------

TCHARS = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
names = st.text(TCHARS, min_size=1, max_size=8).map(str.encode)
status_lines = st.one_of(
    st.sampled_from([b"HTTP/1.1 200 OK", b"HTTP/1.1 200", b"HTTP/1.1 200 ", b"HTTP/1.0 200 OK",
                     b"HTTP/1.1 404 Not Found", b"HTTP/1.1 500 a \x80\t b"]),
    st.sampled_from([b"HTTP/1.1  200 OK", b"HTTP/1.2 200 OK", b"HTTP/2.0 200 OK",
                     b"HTTP/1.1 2000 OK", b"HTTP/1.1 099 OK", b"HTTP/1.1 600 OK",
                     b"HTTP/1.1 200 O\x01K", b"http/1.1 200 OK", b"HTTP/1.1 20 OK",
                     b" HTTP/1.1 200 OK", b"HTTP/1.1 200 OK\x00", b"HTTP/1.1 +20 OK"]))
lengths = st.sampled_from([
    b"15", b"015", b"0015", b" 15", b"15 ", b"\t15",  # taken by both
    b"+15", b"1_5", b"0x0f", b"15a", b"", b"1 5", b"-15", b"\xef\xbc\x91\xef\xbc\x95",
    b"15, 15", b"15,15", b"15 , 015", b"15, 16", b"15,", b",15", b"99999999999999999999999"])
codings = st.sampled_from([
    b"chunked", b"Chunked", b"CHUNKED", b" chunked ", b"chunked\t", b"\tchunked",
    b"chunked \t", b"gzip, chunked", b"chunked, chunked", b"chunked,chunked", b"chunked, gzip",
    b"identity", b"xchunked", b"chunkedx", b"", b"chunked,", b",chunked", b"chunked;q=1",
    b"\"chunked\""])
fields = st.one_of(
    st.tuples(names, st.sampled_from([b": v", b":v", b":", b": a b", b": \x80", b": v\t",
                                      b": text/event-stream"])).map(b"".join),
    st.sampled_from([b" X: y", b"X : y", b"X\t: y", b"X y", b": y", b"X: a\x00b", b"X: \x7f",
                     b"X: a\rb", b"X: a\nb", b"\x80: y", b"X: a\r\n b", b"X: a\r\n\tb",
                     b"Content-Type: text/plain\r\n  more"]),
    lengths.map(lambda v: b"Content-Length: " + v),
    codings.map(lambda v: b"Transfer-Encoding: " + v),
)


@st.composite
def answers(draw: st.DrawFn) -> bytes:
    status = draw(st.one_of(status_lines.filter(lambda s: b"200" in s or b"404" in s
                                                or b"500" in s), status_lines))
    lines = draw(st.lists(fields, max_size=4))
    return b"\r\n".join([status, *lines]) + b"\r\n\r\n" + BODY


# --- the checks ------------------------------------------------------------------------------

H = b"HTTP/1.1 200 OK\r\n"
NAMED = [
    (H + b"Transfer-Encoding: chunked\r\n\r\n" + BODY, Verdict("accept", b"hello")),
    (H + b"Content-Length: 15\r\n\r\n" + BODY, Verdict("accept", BODY)),
    (H + b"Content-Type: text/event-stream\r\n\r\n" + BODY, Verdict("accept", BODY)),
    (H + b"Transfer-Encoding: Chunked \r\n\r\n" + BODY, Verdict("accept", b"hello")),
    (H + b"Content-Length: 015\r\n\r\n" + BODY, Verdict("accept", BODY)),
    (H + b"Content-Length: 1_5\r\n\r\n" + BODY, REFUSED),
    (H + b"Content-Length: +15\r\n\r\n" + BODY, REFUSED),
    (H + b"Content-Length: 0x0f\r\n\r\n" + BODY, REFUSED),
    (H + "Content-Length: \uff11\uff15\r\n\r\n".encode() + BODY, REFUSED),
    (H + b"Content-Length: 15\r\nContent-Length: 16\r\n\r\n" + BODY, REFUSED),
    (H + b"Content-Length: 15, 16\r\n\r\n" + BODY, REFUSED),
    (H + b"Content-Length : 15\r\n\r\n" + BODY, REFUSED),
    (H + b"Transfer-Encoding : chunked\r\n\r\n" + BODY, REFUSED),
    (H + b"X: a\r\n b\r\nContent-Length: 15\r\n\r\n" + BODY, REFUSED),  # obs-fold
    (H + b"Transfer-Encoding: chunked\r\nContent-Length: 15\r\n\r\n" + BODY, REFUSED),
    (H + b"Content-Length: 15\r\nTransfer-Encoding: chunked\r\n\r\n" + BODY, REFUSED),
    (H + b"Content-Length: 15\nX: y\r\n\r\n" + BODY, REFUSED),  # bare LF
    (H + b"X: a\x00b\r\n\r\n" + BODY, REFUSED),
    # Stricter than llhttp: codings it takes.
    (H + b"Transfer-Encoding: gzip, chunked\r\n\r\n" + BODY, REFUSED),
    (H + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + BODY, REFUSED),
    (H + b"Transfer-Encoding: chunked, gzip\r\n\r\n" + BODY, REFUSED),
    (H + b"Transfer-Encoding: identity\r\n\r\n" + BODY, REFUSED),
    (H + b"Transfer-Encoding: chunked\t\r\n\r\n" + BODY, REFUSED),  # llhttp: not chunked
    (b"HTTP/2.0 200 OK\r\nContent-Length: 15\r\n\r\n" + BODY, REFUSED),
    # More lenient than llhttp, as RFC 9110 8.6 allows.
    (H + b"Content-Length: 15\r\nContent-Length: 15\r\n\r\n" + BODY, Verdict("accept", BODY)),
    (H + b"Content-Length: 15, 015\r\n\r\n" + BODY, Verdict("accept", BODY)),
]


def shown(answer: bytes) -> str:
    return answer.decode("latin-1").encode("unicode_escape").decode()


def differs(mine: Verdict, theirs: Verdict, head: bytes) -> bool:
    """Whether ours and one llhttp's disagree other than as STRICTER or LENIENT say."""
    if mine == theirs:
        return False
    if mine.kind == "refuse" and theirs.kind == "accept" and why_differs(head, STRICTER):
        return False
    return not (mine.kind == "accept" and theirs.kind == "refuse"
                and why_differs(head, LENIENT))


def check(cases: list[bytes]) -> None:
    """Every reader's verdict on every case; one failure lists every disagreement. Ours is
    held to Node's and to httptools' each: their llhttp versions differ (Node's 9.3 takes an
    empty Transfer-Encoding as a body to the connection's end, httptools' refuses it)."""
    theirs = node_verdicts(NODE_SCRIPT, cases) or [None] * len(cases)
    wrong = []
    for answer, in_node in zip(cases, theirs, strict=True):
        mine, in_httptools = ours(answer), httptools_verdict(answer)
        head = answer[:answer.find(b"\r\n\r\n")]
        if differs(mine, in_httptools, head):
            wrong.append(f"ours {mine} != httptools {in_httptools}: {shown(answer)}")
        # httptools cannot say a body ended with the connection; Node can.
        if in_node is not None and differs(mine, in_node, head):
            wrong.append(f"ours {mine} != Node {in_node}: {shown(answer)}")
    assert not wrong, "\n".join(wrong[:40]) + f"\n({len(wrong)} in all)"
    skip_without_node()


def test_the_named_heads() -> None:
    """`1_0`, `+5`, a space before the colon, obs-fold, both framings, differing lengths:
    refused as llhttp refuses them; codings llhttp takes and the relay cannot follow
    refused; a length repeated with one value taken."""
    check([answer for answer, _ in NAMED])
    for answer, verdict in NAMED:
        assert ours(answer) == verdict, answer


@settings(max_examples=5, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(st.lists(answers(), min_size=120, max_size=120))
def test_generated_heads_agree_with_llhttp(cases: list[bytes]) -> None:
    """600 answers in five batches (no shrinking: each try is a Node run)."""
    check(cases)


@pytest.mark.parametrize(("head", "message"), [
    (H + b"Content-Length: 1_0", "bad Content-Length b'1_0'"),
    (H + b"Content-Length: 5\r\nContent-Length: 6", "differing Content-Length"),
    (H + b"Transfer-Encoding: gzip, chunked", "only `chunked`, once"),
    (H + b"Transfer-Encoding: chunked\r\nContent-Length: 5", "both Transfer-Encoding"),
    (H + b"Content-Length : 5", "no whitespace before the colon"),
    (H + b"X: a\r\n b", "no line folding"),
    (H + b"Content-Length: " + b"9" * 5000, "past 2**64 - 1"),
    (H + b"X: " + b"a" * MAX_HEAD_BYTES, "response head too large"),
])
def test_each_refusal_says_why(head: bytes, message: str) -> None:
    with pytest.raises(EngineProtocolError, match=re.escape(message)):
        response_head(head)


def test_repeated_fields_are_joined_and_framing_read() -> None:
    head = response_head(H + b"X-A: 1\r\nx-a: 2\r\nContent-Length: 7, 07")
    assert (head.status, head.headers["x-a"], head.chunked, head.length) == (200, "1, 2",
                                                                             False, 7)
    head = response_head(b"HTTP/1.0 404\r\nTransfer-Encoding: chunked")
    assert (head.status, head.chunked, head.length) == (404, True, None)
