"""The relay's chunk parser (wire/framing.py ChunkedBody) against llhttp, differentially.

The relay forwards an engine's chunked body as it came, so it must end the body where the
client's parser will, and the gateway's own front door parses with llhttp (httptools). Each
body here goes to three readers: ours, httptools' llhttp in this process, and Node's llhttp
(tests/gateway/llhttp_verdict.js, one Node process for a whole batch), and their verdicts
(accept with which payload, refuse, or still incomplete at the end of the bytes) must agree,
but for the cases listed in `STRICTER`: where llhttp takes a line that RFC 9112 forbids
(an empty extension name or value), or one longer than our bound, ours refuses it. Where the
RFC is the lenient one (whitespace around ';' and '=', which llhttp refuses), ours refuses
too. The stricter verdict each time: a relay that refuses what one reader or the other
might read otherwise cannot be made to disagree with either.

Node (20 or later) is required where CI=true (.github/workflows/test.yml installs it);
elsewhere its absence skips the Node half with a reason, and httptools still checks every
case.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import httptools
import pytest
from glm_operator.gateway.wire.framing import (
    MAX_LINE_BYTES,
    ChunkedBody,
    EngineProtocolError,
    chunk_size,
)
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from .llhttp_node import Verdict, node_verdicts, skip_without_node

NODE_SCRIPT = "llhttp_verdict.js"
HEAD = b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"


def ours(data: bytes, piece: int | None = None) -> Verdict:
    """ChunkedBody's verdict, `data` fed whole or `piece` bytes at a time."""
    chunked, out = ChunkedBody(), list[bytes]()
    step = piece or len(data) or 1
    try:
        for start in range(0, len(data), step):
            used = chunked.feed(data[start:start + step], out)
            if chunked.complete:
                # Every body here ends where its bytes end: a reader that ends it sooner
                # has taken the rest for the next message.
                if start + used < len(data):
                    return Verdict("accept-early", b"".join(out))
                break
    except EngineProtocolError:
        return Verdict("refuse")
    return Verdict("accept", b"".join(out)) if chunked.complete else Verdict("incomplete")


class _Collect:
    def __init__(self) -> None:
        self.body = bytearray()
        self.done = False
        self.after = False

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.done = True

    def on_message_begin(self) -> None:
        self.after = self.done


def httptools_verdict(data: bytes) -> Verdict:
    seen = _Collect()
    parser = httptools.HttpRequestParser(seen)
    try:
        parser.feed_data(HEAD + data)
    except httptools.HttpParserError:
        if not seen.done:
            return Verdict("refuse")
        seen.after = True  # what followed the body was refused as the next request
    if seen.done:
        return Verdict("accept-early" if seen.after else "accept", bytes(seen.body))
    return Verdict("incomplete")


# --- where ours is stricter than llhttp ------------------------------------------------------

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]"
_QUOTED = rb'"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"'
# llhttp's chunk-size line, as its verdicts show it: RFC 9112's without BWS, and a name and
# a value may be empty (its quoted strings are the RFC's, control bytes refused).
_LLHTTP_LINE = re.compile(
    rb"[0-9A-Fa-f]+(?:;%b*(?:=(?:%b*|%b))?)*" % (_TOKEN, _TOKEN, _QUOTED))
_QUOTED_STRING = re.compile(_QUOTED)

# Where ours refuses a body llhttp accepts: the RFC's grammar, or a bound of ours. Each:
# why, and the test of the first size line that says so.
STRICTER: dict[str, Callable[[bytes], bool]] = {
    # RFC 9112 7.1.1: chunk-ext-name = token, chunk-ext-val = token / quoted-string, a token
    # being 1*tchar; llhttp takes `5;=x`, `5;;x` and `5;a=`.
    "an empty extension name or value": lambda line: (
        re.search(rb";(?=[;=]|$)|=(?=;|$)", _QUOTED_STRING.sub(b'""', line)) is not None),
    # Ours bounds a line at MAX_LINE_BYTES (leading zeros, long extensions): llhttp does
    # not bound a chunk-size line.
    "a size line over MAX_LINE_BYTES": lambda line: len(line) > MAX_LINE_BYTES,
}


def why_stricter(line: bytes) -> str | None:
    """Which STRICTER case a first size line (CRLF removed) is, if llhttp's grammar
    takes it."""
    if _LLHTTP_LINE.fullmatch(line) is None:
        return None
    return next((why for why, test in STRICTER.items() if test(line)), None)


# --- the bodies ------------------------------------------------------------------------------

TCHARS = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
HOSTILE_BYTES = [b"\x00", b" ", b"\t", b"\r", b"\n", b'"', b"\\", b";", b"=", b"\x7f", b"\x80",
                 b"\xff", b"\x0b", b"\x0c", b",", b":", b"x", b"_", b"+", b"-", b"g"]
# Digits Python's int() takes in a str and that are not ASCII hex digits.
UNICODE_DIGITS = ["\uff10", "\uff11", "\u0660", "\u0661", "\u0966", "\u06f1", "\U0001d7ce",
                  "\u00b9", "\u2081", "\uff21", "\uff41"]

tokens = st.text(TCHARS, min_size=1, max_size=6).map(str.encode)
quoted = st.lists(st.one_of(
    st.sampled_from([b"a", b" ", b"\t", b"!", b"#", b"~", b"\x80", b"\xfe", b";", b"="]),
    st.sampled_from([b"\\\"", b"\\\\", b"\\a", b"\\\t", b"\\\x80"]),  # quoted-pairs
    st.sampled_from([b"\x00", b"\x01", b"\x7f", b"\\\x00", b"\\", b'"'])),  # hostile
    max_size=6).map(lambda parts: b'"' + b"".join(parts) + b'"')
extension = st.tuples(
    st.one_of(tokens, st.just(b"")),
    st.one_of(st.none(), tokens, quoted, st.just(b"")),
    st.sampled_from([b"", b"", b"", b" ", b"\t"]),  # BWS, which llhttp refuses
).map(lambda e: b";" + e[2] + e[0] + (b"" if e[1] is None else e[2] + b"=" + e[1]))


@st.composite
def size_lines(draw: st.DrawFn, size: int) -> bytes:
    """A chunk-size line (no CRLF) for a chunk of `size` bytes: valid, or made hostile."""
    digits = f"{size:x}"
    digits = "".join(c.upper() if draw(st.booleans()) else c for c in digits)
    digits = "0" * draw(st.sampled_from([0, 0, 0, 1, 3, 15, 20])) + digits
    line = digits.encode() + b"".join(draw(st.lists(extension, max_size=3)))
    mutation = draw(st.sampled_from(
        ["none", "none", "none", "0x", "0X", "underscore", "lead", "trail", "plus", "minus",
         "unicode", "insert", "empty", "overlong", "leading zeros past the line bound"]))
    if mutation in ("0x", "0X"):
        return mutation.encode() + line
    if mutation == "underscore" and len(digits) > 1:
        return digits[:1].encode() + b"_" + line[1:]
    if mutation == "lead":
        return draw(st.sampled_from([b" ", b"\t", b"\x00", b";"])) + line
    if mutation == "trail":
        return line + draw(st.sampled_from([b" ", b"\t", b"\x00", b";", b"=", b"\r"]))
    if mutation in ("plus", "minus"):
        return (b"+" if mutation == "plus" else b"-") + line
    if mutation == "unicode":
        at = draw(st.integers(0, len(digits) - 1))
        return (digits[:at] + draw(st.sampled_from(UNICODE_DIGITS))
                + digits[at + 1:]).encode() + line[len(digits):]
    if mutation == "insert":
        at = draw(st.integers(0, len(line)))
        return line[:at] + draw(st.sampled_from(HOSTILE_BYTES)) + line[at:]
    if mutation == "empty":
        return b""
    if mutation == "overlong":
        return b"1" * draw(st.sampled_from([17, 18, 40])) + line
    if mutation == "leading zeros past the line bound":
        return b"0" * MAX_LINE_BYTES + line
    return line


trailers = st.one_of(
    st.just(b""),
    st.tuples(tokens, st.sampled_from([b": v", b":v", b":", b": a b", b": \x80", b": v\t"])
              ).map(lambda t: t[0] + t[1] + b"\r\n"),
    st.sampled_from([b" X: y\r\n", b"X : y\r\n", b"X y\r\n", b": y\r\n", b"X: a\x00b\r\n",
                     b"X: \x7f\r\n", b"X: y\n", b"X: y\r\n\tz\r\n", b"\x80: y\r\n"]),
)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """A chunked body: one chunk, perhaps hostile, then the last chunk and a trailer."""
    payload = draw(st.one_of(st.binary(max_size=40),
                             st.sampled_from([b"0\r\n\r\n", b"\r\n", b"5\r\nhello"])))
    line = draw(size_lines(len(payload)))
    end = draw(st.sampled_from([b"\r\n"] * 6 + [b"\n", b"\r", b"\r\r\n", b"\n\r"]))
    after = draw(st.sampled_from([b"\r\n"] * 6 + [b"\n", b"", b"XX", b"\r\r\n"]))
    last = draw(st.sampled_from([b"0", b"0", b"00", b"0;a=b", b"0x0", b" 0"]))
    return line + end + payload + after + last + b"\r\n" + draw(trailers) + b"\r\n"


# --- the checks ------------------------------------------------------------------------------

A16 = b"a" * 16
REFUSED = Verdict("refuse")
# Bodies everyone knows by name, and what ours makes of each (llhttp must agree).
NAMED = [
    (b"10\r\n" + A16 + b"\r\n0\r\n\r\n", Verdict("accept", A16)),
    (b"0x10\r\n" + A16 + b"\r\n0\r\n\r\n", REFUSED),
    (b"1_0\r\n" + A16 + b"\r\n0\r\n\r\n", REFUSED),
    (b" 10\r\n" + A16 + b"\r\n0\r\n\r\n", REFUSED),
    (b"10 \r\n" + A16 + b"\r\n0\r\n\r\n", REFUSED),
    (b"+10\r\n" + A16 + b"\r\n0\r\n\r\n", REFUSED),
    (b"-0\r\n\r\n", REFUSED),
    (b"-1\r\na\r\n0\r\n\r\n", REFUSED),
    (b"\r\n0\r\n\r\n", REFUSED),  # an empty size
    ("\uff11\uff10\r\n".encode() + A16 + b"\r\n0\r\n\r\n", REFUSED),  # fullwidth
    ("\u0661\u0660\r\n".encode() + b"a" * 10 + b"\r\n0\r\n\r\n", REFUSED),  # Arabic-Indic
    (b"10\n" + A16 + b"\r\n0\r\n\r\n", REFUSED),  # bare LF after the size
    (b"10\r\n" + A16 + b"\n0\r\n\r\n", REFUSED),  # ... after the data
    (b"10\r\n" + A16 + b"\r\n0\n\n", REFUSED),  # ... at the end
    (b"1\x000\r\n" + A16 + b"\r\n0\r\n\r\n", REFUSED),  # NUL
    (b"10;a=b;c=\"d e\"\r\n" + A16 + b"\r\n0\r\n\r\n", Verdict("accept", A16)),
    (b"10 ;a=b\r\n" + A16 + b"\r\n0\r\n\r\n", REFUSED),  # BWS: the RFC's, not llhttp's
    (b"1" * 17 + b"\r\n", REFUSED),  # past 2**64
    (b"f" * 16 + b"\r\n", Verdict("incomplete")),  # 2**64 - 1: a size, as llhttp's
    (b"0" * 40 + b"10\r\n" + A16 + b"\r\n0\r\n\r\n", Verdict("accept", A16)),
    (b"5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n", Verdict("accept", b"hello")),
]


def first_line(body: bytes) -> bytes:
    return re.split(rb"\r?\n", body, maxsplit=1)[0]


def shown(body: bytes) -> str:
    """A body for a failure's message: long runs cut."""
    return re.sub(rb"(.)\1{20,}", lambda m: b"%b*%d" % (m[1], len(m[0])), body).decode(
        "latin-1").encode("unicode_escape").decode()


def check(cases: list[bytes]) -> None:
    """Every reader's verdict on every case; one failure lists every disagreement."""
    theirs = node_verdicts(NODE_SCRIPT, cases) or [None] * len(cases)
    wrong = []
    for body, in_node in zip(cases, theirs, strict=True):
        mine = ours(body)
        if ours(body, 1) != mine:  # however the packets split it
            wrong.append(f"ours {mine} whole, {ours(body, 1)} byte by byte: {shown(body)}")
        in_httptools = httptools_verdict(body)
        # Node's verdict is the body's alone (what follows is the next request's).
        early = Verdict(in_httptools.kind.removesuffix("-early"), in_httptools.body)
        if in_node is not None and in_node != early:
            wrong.append(f"Node {in_node} != httptools {in_httptools}: {shown(body)}")
        why = why_stricter(first_line(body))
        if mine == in_httptools:
            continue
        if not (mine.kind == "refuse" and in_httptools.kind.startswith("accept") and why):
            wrong.append(f"ours {mine} != llhttp {in_httptools}: {shown(body)}")
    assert not wrong, "\n".join(wrong[:40]) + f"\n({len(wrong)} in all)"
    skip_without_node()


def test_the_named_cases() -> None:
    """0x10, 1_0, spaces, signs, Unicode digits, bare LF, NUL, past 64 bits: refused, as
    llhttp refuses them; a plain size, leading zeros, extensions and a trailer taken."""
    check([body for body, _ in NAMED])
    for body, verdict in NAMED:
        assert ours(body) == verdict, body


@pytest.mark.parametrize("line", [b"0x10", b"1_0", b" 10", b"10 ", b"+10", b"-0", b"",
                                  "\uff11\uff10".encode(), "\u0661\u0660".encode(),
                                  b"10;", b"10 ;a", b"10;a =b", b"10;a=\"\x00\"", b"1" * 17])
def test_chunk_size_refuses_what_int_takes(line: bytes) -> None:
    """Each of these int(line, 16) took (or, for the bytes of Unicode digits, int() takes as
    a str), or the RFC forbids."""
    with pytest.raises(EngineProtocolError, match="chunk"):
        chunk_size(line)


def test_chunk_size_takes_the_rfcs_lines() -> None:
    assert chunk_size(b"10") == chunk_size(b"0010") == chunk_size(b"10;a") == 16
    assert chunk_size(b'1A;a=b;c="d \\" e";f') == 26
    assert chunk_size(b"0" * 30 + b"f" * 16) == 2**64 - 1


@settings(max_examples=5, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(st.lists(bodies(), min_size=150, max_size=150))
def test_generated_bodies_agree_with_llhttp(cases: list[bytes]) -> None:
    """Hypothesis draws 750 bodies in five batches, the first its simplest (no shrinking:
    each try is a Node run; a failure lists every disagreeing body instead)."""
    check(cases)


@pytest.mark.parametrize(("line", "why"), [
    (b"5;=x", "an empty extension name or value"),
    (b"5;a=", "an empty extension name or value"),
    (b"5;a=;b", "an empty extension name or value"),
    (b"5;;a", "an empty extension name or value"),
    (b"0" * MAX_LINE_BYTES + b"5", "a size line over MAX_LINE_BYTES"),
])
def test_each_case_where_the_rfc_is_stricter_than_llhttp(line: bytes, why: str) -> None:
    """The exceptions, one of each: llhttp takes the body, RFC 9112 does not, ours refuses."""
    body = line + b"\r\nhello\r\n0\r\n\r\n"
    assert why_stricter(line) == why
    assert httptools_verdict(body) == Verdict("accept", b"hello")
    assert ours(body).kind == "refuse"
    assert node_verdicts(NODE_SCRIPT, [body]) in ([Verdict("accept", b"hello")], None)
    skip_without_node()
