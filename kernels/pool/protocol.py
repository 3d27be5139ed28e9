"""Framing of the private channel between the app and a worker process.

Each message is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON.
The channel is a socketpair inherited by the worker as an extra file descriptor, not
its stdout/stderr, which a candidate can print to. Shared by both sides: no JAX here.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from typing import Any

HEADER = struct.Struct(">I")
MAX_FRAME = 256 * 1024 * 1024  # a frame this large means a corrupted stream


class ProtocolError(Exception):
    """The peer wrote something that is not a frame."""


def encode(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, default=_fallback).encode()
    return HEADER.pack(len(body)) + body


def _fallback(value: Any) -> Any:
    # numpy scalars and the like: never let an odd value kill a reply.
    for cast in (float, int):
        try:
            return cast(value)
        except (TypeError, ValueError):
            pass
    return repr(value)


def decode(body: bytes, what: str = "frame") -> dict[str, Any]:
    """A JSON object from the peer (``what`` names it in the error); ProtocolError when
    it is anything else. The candidate channel's headers are read with it too."""
    try:
        message = json.loads(body)
    except ValueError as exc:
        raise ProtocolError(f"undecodable {what}: {exc}") from exc
    if not isinstance(message, dict):
        raise ProtocolError(f"{what} is not a JSON object")
    return message


def _length(header: bytes) -> int:
    (length,) = HEADER.unpack(header)
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes exceeds the limit")
    return length


def recv_blocking(sock: socket.socket) -> dict[str, Any] | None:
    """Read one frame from a blocking socket; None at end of stream."""
    header = _recv_exact(sock, HEADER.size)
    if header is None:
        return None
    body = _recv_exact(sock, _length(header))
    if body is None:
        return None
    return decode(body)


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


async def recv(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """Read one frame from an asyncio stream; None at end of stream."""
    try:
        header = await reader.readexactly(HEADER.size)
        body = await reader.readexactly(_length(header))
    except (asyncio.IncompleteReadError, ConnectionResetError):
        return None
    return decode(body)
