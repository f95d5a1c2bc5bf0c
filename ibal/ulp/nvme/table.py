"""Little-endian field tables for NVMe structures.

NVMe lays its structures out little-endian and byte-aligned, unlike the
network-order bit tables of :mod:`ibal.wire.fields`; a :class:`LeTable` is the
same idea for them: one row per field (name, width in bytes, integer or
bytes), compiled into one ``struct`` format, checked encode and decode by name.
A 3-byte integer (the keyed SGL's length) is a row of its own kind.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ibal.wire.fields import FieldError

Value = int | bytes
_INT = {1: "B", 2: "H", 4: "I", 8: "Q"}


@dataclass(frozen=True)
class Row:
    """A field: ``size`` bytes at the next offset; ``raw``: a byte string, not an integer;
    ``reserved``: sent as zero (decoded, never required)."""

    name: str
    size: int
    raw: bool = False
    reserved: bool = False


def U(name: str, size: int) -> Row:
    """An unsigned little-endian integer of ``size`` bytes (1, 2, 3, 4 or 8)."""
    if size not in (1, 2, 3, 4, 8):
        raise ValueError(f"{name}: integers are 1, 2, 3, 4 or 8 bytes")
    return Row(name, size)


def B(name: str, size: int) -> Row:
    """``size`` raw bytes."""
    return Row(name, size, raw=True)


def RSV(size: int) -> Row:
    """``size`` reserved bytes."""
    return Row("", size, raw=True, reserved=True)


class LeTable:
    """A compiled little-endian table: ``encode(**fields)``, ``decode(buf, off)``."""

    def __init__(self, name: str, rows: Iterable[Row], *, size: int | None = None) -> None:
        self.name = name
        fmt = ["<"]
        self.rows: list[Row] = []
        self.offsets: dict[str, int] = {}
        pos = 0
        for r in rows:
            if r.reserved:
                r = Row(f"resv_{pos}", r.size, True, True)
            elif r.name in self.offsets:
                raise ValueError(f"{name}.{r.name}: duplicate field")
            fmt.append(f"{r.size}s" if r.raw or r.size == 3 else _INT[r.size])
            self.offsets[r.name] = pos
            self.rows.append(r)
            pos += r.size
        if size is not None:
            if size < pos:
                raise ValueError(f"{name}: fields end at {pos}, past the size {size}")
            if size > pos:
                fmt.append(f"{size - pos}x")
        self.size = size if size is not None else pos
        self._struct = struct.Struct("".join(fmt))
        self.names = tuple(r.name for r in self.rows if not r.reserved)

    def __repr__(self) -> str:
        return f"<LeTable {self.name} {self.size} bytes>"

    def encode(self, values: Mapping[str, Value] | None = None, /, **kw: Value) -> bytes:
        """The structure; omitted fields are zero.  ``FieldError`` for an unknown field
        or a value that does not fit."""
        merged = dict(values or {}, **kw)
        unknown = set(merged) - set(self.names)
        if unknown:
            raise FieldError("unknown", f"{self.name}: unknown fields {sorted(unknown)}")
        out: list[Value] = []
        for r in self.rows:
            v = merged.get(r.name, 0) if not r.reserved else 0
            out.append(self._check(r, v))
        return self._struct.pack(*out)

    def _check(self, r: Row, v: Value) -> Value:
        if r.raw:
            if r.reserved:
                return bytes(r.size)
            if isinstance(v, int) and v == 0:
                return bytes(r.size)
            if not isinstance(v, (bytes, bytearray, memoryview)):
                raise FieldError("type", f"{self.name}.{r.name}: expected bytes", r.name)
            b = bytes(v)
            if len(b) > r.size:
                raise FieldError("range", f"{self.name}.{r.name}: {len(b)} bytes, at most "
                                          f"{r.size}", r.name)  # fmt: skip
            return b.ljust(r.size, b"\0")
        if not isinstance(v, int) or isinstance(v, bool):
            raise FieldError("type", f"{self.name}.{r.name}: expected int", r.name)
        if not 0 <= v < 1 << (8 * r.size):
            raise FieldError("range", f"{self.name}.{r.name}={v} does not fit {r.size} bytes",
                             r.name)  # fmt: skip
        return v.to_bytes(3, "little") if r.size == 3 else v

    def decode(self, buf: bytes | bytearray | memoryview, off: int = 0) -> dict[str, Value]:
        """Every field by name (reserved ones as ``resv_<offset>``); ``FieldError('short')``."""
        if off < 0 or len(buf) - off < self.size:
            raise FieldError("short", f"{self.name}: need {self.size} bytes at {off}, have "
                                      f"{len(buf) - off}")  # fmt: skip
        vals = self._struct.unpack_from(buf, off)
        out: dict[str, Value] = {}
        for r, v in zip(self.rows, vals, strict=True):
            if r.size == 3 and not r.raw:
                v = int.from_bytes(v, "little")
            out[r.name] = v
        return out

    def reserved_clear(self, buf: bytes | bytearray | memoryview, off: int = 0) -> bool:
        """Whether every reserved byte is zero."""
        d = self.decode(buf, off)
        return all(not any(d[r.name]) for r in self.rows  # type: ignore[arg-type]
                   if r.reserved)  # fmt: skip
