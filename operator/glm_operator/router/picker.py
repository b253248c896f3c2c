"""Ask the endpoint picker (the Gateway API Inference Extension's EPP) which pod serves a
request, over Envoy's external-processing protocol, as a gateway would.

One bidirectional stream per request: the request's headers, then its body (in pieces of at
most BODY_PIECE_BYTES, the last marked end of stream), with the chosen version's ready pods
as the subset hint (`envoy.lb.subset_hint` / `x-gateway-destination-endpoint-subset`, the
EPP's own names); the EPP answers the headers phase with `x-gateway-destination-endpoint`
("ip:port", a fallback list after a comma where it gives one). The router needs nothing of
the response phases, so it ends the stream there: the EPP's prefix scorer has recorded its
pick by then.

The call goes over grpc_wire.py's plain-asyncio HTTP/2 client (the same gRPC messages, a
fraction of grpc.aio's cost per stream): the request side written in one go and half-closed
after the body, the answer read as it is parsed. The router never loads grpc itself, and the
pod gateways load none of this module (their memory budget).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from google.protobuf import struct_pb2
from google.protobuf.message import DecodeError

from glm_operator.router.grpc_wire import Call, CallFailed, Channel

SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
DESTINATION_HEADER = "x-gateway-destination-endpoint"
BODY_PIECE_BYTES = 1024 * 1024  # under gRPC's 4 MiB message limit, with room to spare
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
PROCESS_PATH = b"/envoy.service.ext_proc.v3.ExternalProcessor/Process"


class PickFailed(Exception):
    """The picker gave no pod: down, slow, or it refused (`status`, its own answer)."""

    def __init__(self, reason: str, detail: str, status: int | None = None,
                 body: bytes = b"") -> None:
        super().__init__(detail)
        self.reason = reason  # unavailable | timeout | refused | invalid
        self.status = status
        self.body = body


@dataclass(frozen=True, slots=True)
class Pick:
    address: str  # "ip:port" of the pod's gateway


def _header_map(headers: Mapping[str, str]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=key, raw_value=value.encode()) for key, value in headers.items()
    ])


def request_messages(headers: Mapping[str, str], body: bytes, subset: Iterable[str]
                     ) -> list[ext_proc.ProcessingRequest]:
    """The exchange's request side: headers (with the subset hint), then the body."""
    hint = struct_pb2.Struct()
    hint.update({SUBSET_KEY: list(subset)})
    metadata = base_pb2.Metadata(filter_metadata={SUBSET_NAMESPACE: hint})
    messages = [ext_proc.ProcessingRequest(
        request_headers=ext_proc.HttpHeaders(headers=_header_map(headers), end_of_stream=False),
        metadata_context=metadata)]
    pieces = [body[i:i + BODY_PIECE_BYTES] for i in range(0, len(body), BODY_PIECE_BYTES)]
    for index, piece in enumerate(pieces or [b""]):
        last = index == max(len(pieces), 1) - 1
        messages.append(ext_proc.ProcessingRequest(
            request_body=ext_proc.HttpBody(body=piece, end_of_stream=last),
            metadata_context=metadata))
    return messages


_SUBSET_BYTES: dict[tuple[str, ...], bytes] = {}  # serialized hints, by subset
_SUBSETS_KEPT = 64  # versions times pod sets seen lately; the cache starts over past it


def _subset_bytes(subset: tuple[str, ...]) -> bytes:
    """A ProcessingRequest holding only the subset hint, serialized: the same for every
    request to a version until its pods change."""
    found = _SUBSET_BYTES.get(subset)
    if found is None:
        hint = struct_pb2.Struct()
        hint.update({SUBSET_KEY: list(subset)})
        found = ext_proc.ProcessingRequest(metadata_context=base_pb2.Metadata(
            filter_metadata={SUBSET_NAMESPACE: hint})).SerializeToString()
        if len(_SUBSET_BYTES) >= _SUBSETS_KEPT:
            _SUBSET_BYTES.clear()
        _SUBSET_BYTES[subset] = found
    return found


def request_bytes(headers: Mapping[str, str], body: bytes, subset: Iterable[str]
                  ) -> list[bytes]:
    """request_messages(), serialized: each message's own part followed by the subset hint's
    bytes (protobuf reads a concatenation as one message with the fields of both)."""
    hint = _subset_bytes(tuple(subset))
    out = [ext_proc.ProcessingRequest(request_headers=ext_proc.HttpHeaders(
        headers=_header_map(headers), end_of_stream=False)).SerializeToString() + hint]
    pieces = [body[i:i + BODY_PIECE_BYTES] for i in range(0, len(body), BODY_PIECE_BYTES)]
    for index, piece in enumerate(pieces or [b""]):
        last = index == max(len(pieces), 1) - 1
        out.append(ext_proc.ProcessingRequest(request_body=ext_proc.HttpBody(
            body=piece, end_of_stream=last)).SerializeToString() + hint)
    return out


def destination(response: ext_proc.ProcessingResponse) -> str | None:
    """The pod the headers-phase answer names, or None where it names none."""
    if not response.HasField("request_headers"):
        return None
    mutation = response.request_headers.response.header_mutation
    for option in mutation.set_headers:
        if option.header.key.lower() == DESTINATION_HEADER:
            value = (option.header.raw_value or option.header.value.encode()).decode()
            return value.split(",")[0].strip() or None
    return None


class EndpointPicker:
    def __init__(self, address: str, timeout: float) -> None:
        self.address = address
        self.timeout = timeout
        self._channel = Channel(address, MAX_MESSAGE_BYTES)

    async def pick(self, headers: Mapping[str, str], body: bytes, subset: Iterable[str]
                   ) -> Pick:
        messages = request_bytes(headers, body, subset)
        call: Call | None = None
        try:
            async with asyncio.timeout(self.timeout):
                call = await self._channel.call(PROCESS_PATH, messages)
                while (data := await call.next_message()) is not None:
                    response = ext_proc.ProcessingResponse.FromString(data)
                    if response.HasField("immediate_response"):
                        immediate = response.immediate_response
                        raise PickFailed("refused", immediate.details or "the picker refused",
                                         int(immediate.status.code) or 503, immediate.body)
                    address = destination(response)
                    if address is not None:
                        return Pick(address)
                    if response.HasField("request_headers"):
                        raise PickFailed("invalid", "the picker named no pod")
            raise PickFailed("invalid", "the picker ended the stream without a pod")
        except TimeoutError:
            if call is not None:
                self._channel.timed_out(call)
            raise PickFailed("timeout", f"no pick within {self.timeout:g} s") from None
        except CallFailed as exc:
            raise PickFailed("unavailable", str(exc)) from None
        except DecodeError as exc:
            raise PickFailed("invalid", f"the picker's answer is not a ProcessingResponse: "
                             f"{exc}") from None
        finally:
            if call is not None:
                call.cancel()

    async def close(self) -> None:
        await self._channel.close()
