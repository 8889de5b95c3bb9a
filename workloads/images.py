"""Images for chat requests, made here and never fetched: solid-colour PNGs of a given size,
encoded with zlib and struct alone, sent as ``data:`` URLs."""

from __future__ import annotations

import base64
import struct
import zlib
from functools import lru_cache


def parse_size(text: str) -> tuple[int, int]:
    """``"WxH"`` as (width, height); ``ValueError`` naming the setting otherwise."""
    w, sep, h = text.lower().partition("x")
    try:
        size = (int(w), int(h))
    except ValueError:
        size = (0, 0)
    if not sep or not (1 <= size[0] <= 8192 and 1 <= size[1] <= 8192):
        raise ValueError(f"image_size must be WIDTHxHEIGHT, each 1..8192 pixels, not {text!r}")
    return size


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


@lru_cache(maxsize=64)
def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A ``width`` x ``height`` PNG of one colour (8-bit RGB, no filter)."""
    row = b"\x00" + bytes(rgb) * width
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(row * height, 9)) + _chunk(b"IEND", b"")


def data_url(width: int, height: int, key: str) -> str:
    """A PNG data URL whose colour is derived from ``key`` (a request id and slot: the same
    key, the same image; different requests, different images)."""
    c = zlib.crc32(key.encode())
    return "data:image/png;base64," + base64.b64encode(png(width, height, (c & 255, (c >> 8) & 255, (c >> 16) & 255))).decode()
