"""Length-prefixed JSON frames: the only thing that crosses a process boundary in the sandbox.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON. Readers check
the length against a cap *before* reading the body, so a hostile writer can make us read at most
`cap` bytes. NaN and infinities are not JSON: the host parser refuses them, whether spelled as
constants or as numbers too large for a float (`1e999`), so that a hostile reward or info value
fails a check instead of slipping through as a float. Bodies must be valid UTF-8 (a forged frame
may not carry surrogate bytes), and nothing is ever unpickled.
"""

from __future__ import annotations

import errno
import json
import os
import select
import struct
import time

HEADER = struct.Struct(">I")
DEFAULT_CAP = 1 << 20


class FrameError(Exception):
    """The peer sent something that is not a well-formed frame (bad JSON, or over the cap)."""


class FrameTooLarge(FrameError):
    pass


def _refuse_constant(name: str):
    raise ValueError(f"non-finite number {name} in JSON")


def _finite_float(text: str) -> float:
    x = float(text)
    if x - x != 0.0:  # inf - inf is nan; nan - nan is nan: only finite numbers pass
        raise ValueError(f"non-finite number {text[:40]} in JSON")
    return x


def decode(body: bytes):
    try:
        # Strict UTF-8 first: json.loads(bytes) would accept encoded surrogates.
        return json.loads(body.decode("utf-8"), parse_constant=_refuse_constant, parse_float=_finite_float)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise FrameError(f"bad JSON frame: {str(e)[:200]}") from None


def encode(obj) -> bytes:
    # allow_nan stays on here: the *sender* may be the untrusted side reporting what it got, and
    # the receiver's parse_constant is what rejects it. A lone surrogate raises here
    # (UnicodeEncodeError): the sender checks its strings first.
    body = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return HEADER.pack(len(body)) + body


def write_all(fd: int, data: bytes, deadline: float | None = None) -> None:
    """Write everything; with a deadline the fd must be non-blocking and TimeoutError may rise."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError("peer did not drain its input") from None
            select.select([], [fd], [], left)
            continue
        view = view[n:]


def _read_exact(fd: int, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        try:
            b = os.read(fd, n - got)
        except InterruptedError:
            continue
        if not b:
            raise EOFError("peer closed the stream")
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def read_frame(fd: int, cap: int = DEFAULT_CAP):
    """Blocking read of one frame (used where the peer is trusted to answer, or we may block)."""
    (n,) = HEADER.unpack(_read_exact(fd, HEADER.size))
    if n > cap:
        raise FrameTooLarge(f"frame of {n} bytes over the cap of {cap}")
    return decode(_read_exact(fd, n))


class FrameReader:
    """Incremental reader for a non-blocking fd: feed() whatever is readable, get whole frames.

    The host multiplexes many children with select(); a child may deliver a frame in pieces, and
    must never make the host block or buffer more than `cap` bytes.
    """

    def __init__(self, fd: int, cap: int = DEFAULT_CAP):
        self.fd, self.cap = fd, cap
        self.buf = bytearray()
        self.need: int | None = None

    def feed(self) -> tuple[list, bool]:
        """Read what is available. Returns (frames, eof). Raises FrameError on a bad frame."""
        frames, eof = [], False
        while True:
            want = HEADER.size if self.need is None else self.need
            try:
                chunk = os.read(self.fd, max(65536, want - len(self.buf)))
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    break
                raise
            if not chunk:
                eof = True
                break
            self.buf += chunk
            while True:
                if self.need is None:
                    if len(self.buf) < HEADER.size:
                        break
                    (n,) = HEADER.unpack_from(self.buf)
                    if n > self.cap:
                        raise FrameTooLarge(f"frame of {n} bytes over the cap of {self.cap}")
                    del self.buf[: HEADER.size]
                    self.need = n
                if len(self.buf) < self.need:
                    break
                body = bytes(self.buf[: self.need])
                del self.buf[: self.need]
                self.need = None
                frames.append(decode(body))
            if len(chunk) < 65536:
                break  # drained: a short read means nothing more is buffered right now
        return frames, eof
