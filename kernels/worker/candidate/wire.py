"""Framing between the judge (the worker) and its candidate process: a JSON header plus
one binary blob, both length-prefixed (``kernels.pool.protocol``'s 4-byte header).

Arrays travel as raw bytes, never as JSON lists: ``pack_arrays`` gives a description
(dtype name, shape) per array and one concatenated buffer. What the candidate process
sends back is untrusted data: ``unpack_arrays`` checks every dtype against an allowlist,
every shape, that the sizes add up exactly, and the receiver bounds the header and the
blob before reading them (a flood is a protocol violation, not a memory exhaustion).
Judge -> candidate only, inputs may also be a pickle (the candidate unpickling data from
the judge cannot hurt the judge); the judge never unpickles anything.
"""

from __future__ import annotations

import json
import select
import socket
import time
from typing import Any

import numpy as np

from tilewright.kernels.pool.protocol import HEADER, ProtocolError, decode

ALLOWED_DTYPES = frozenset({
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64",
})
MAX_DIMS = 8


class ChannelTimeout(Exception):
    """The peer did not answer before the deadline."""


class ChannelClosed(Exception):
    """The peer closed the channel (it died or exited)."""


def send(sock: socket.socket, header: dict[str, Any], blob: bytes | memoryview = b"") -> None:
    body = json.dumps(header).encode()
    sock.sendall(HEADER.pack(len(body)) + body + HEADER.pack(len(blob)))
    if len(blob):
        sock.sendall(blob)


def recv(sock: socket.socket, deadline: float | None = None, max_header: int = 16 << 20,
         max_blob: int = 1 << 30, tick: Any = None) -> tuple[dict[str, Any], bytes]:
    """One message; raises ChannelTimeout, ChannelClosed or ProtocolError (oversized or
    malformed). ``tick()`` is called about every 0.1 s while waiting (memory watch)."""
    size = _length(_read(sock, HEADER.size, deadline, tick), max_header, "header")
    header = decode(_read(sock, size, deadline, tick), "header")
    blob_size = _length(_read(sock, HEADER.size, deadline, tick), max_blob, "blob")
    return header, _read(sock, blob_size, deadline, tick) if blob_size else b""


def _length(raw: bytes, limit: int, what: str) -> int:
    (size,) = HEADER.unpack(raw)
    if size > limit:
        raise ProtocolError(f"a {what} of {size} bytes exceeds the limit of {limit}")
    return size


def _read(sock: socket.socket, size: int, deadline: float | None, tick: Any) -> bytes:
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise ChannelTimeout("no answer before the deadline")
            ready, _, _ = select.select([sock], [], [], min(wait, 0.1))
            if not ready:
                if tick is not None:
                    tick()
                continue
        chunk = sock.recv(min(remaining, 4 << 20))
        if not chunk:
            raise ChannelClosed("the channel was closed")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def pack_arrays(arrays: list[Any]) -> tuple[list[dict[str, Any]], bytes]:
    meta, parts = [], []
    for array in arrays:
        a = np.asarray(array)  # (not ascontiguousarray: it turns a 0-d array into 1-d)
        meta.append({"dtype": a.dtype.name, "shape": list(a.shape)})
        parts.append(a.tobytes(order="C"))
    return meta, b"".join(parts)


def unpack_arrays(meta: Any, blob: bytes, max_arrays: int = 256) -> list[np.ndarray]:
    """Arrays from an untrusted description and buffer; ProtocolError when anything is
    off (unknown dtype, odd shape, sizes that do not add up to the buffer)."""
    if not isinstance(meta, list) or len(meta) > max_arrays:
        raise ProtocolError("the array list is missing or too long")
    arrays, offset = [], 0
    for item in meta:
        if not isinstance(item, dict):
            raise ProtocolError("an array description is not an object")
        name, shape = item.get("dtype"), item.get("shape")
        if name not in ALLOWED_DTYPES:
            raise ProtocolError(f"dtype {name!r} is not allowed")
        if (not isinstance(shape, list) or len(shape) > MAX_DIMS
                or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40
                           for d in shape)):
            raise ProtocolError(f"malformed shape {shape!r}")
        dtype = _dtype(name)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if offset + nbytes > len(blob):
            raise ProtocolError("the arrays are larger than the bytes sent")
        arrays.append(np.frombuffer(blob, dtype=dtype, count=nbytes // dtype.itemsize,
                                    offset=offset).reshape(shape))
        offset += nbytes
    if offset != len(blob):
        raise ProtocolError(f"{len(blob) - offset} bytes beyond the described arrays")
    return arrays


def _dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
