"""Server-sent-event framing that copes with events split across reads."""

from __future__ import annotations


class SSEFramer:
    """Accumulates raw bytes and returns complete ``data`` payloads.

    Handles ``data: x`` and ``data:x`` (TGI omits the space), multi-line data fields,
    comment/keep-alive lines, ``\\r\\n`` line endings, and events split at any byte.
    """

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._buf = buf
            return []
        self._buf = buf[end + 2 :]
        out: list[bytes] = []
        for block in buf[:end].split(b"\n\n"):
            if not block:
                continue
            if block.startswith(b"data:") and b"\n" not in block:
                # Fast path: one data line.
                payload = block[5:]
                out.append(payload[1:] if payload[:1] == b" " else payload)
                continue
            lines = [
                (ln[6:] if ln[5:6] == b" " else ln[5:]) for ln in block.split(b"\n") if ln.startswith(b"data:")
            ]
            if lines:
                out.append(b"\n".join(lines))
        return out

    def reset(self) -> None:
        """Drop the bytes of an unfinished event."""
        self._buf = b""

    @property
    def pending(self) -> bytes:
        """Bytes received after the last complete event (a truncated event at stream end)."""
        return self._buf
