"""Declarative field tables: one table drives encode, decode, validation and dump.

A header (BTH, RETH, a MAD attribute...) is a :class:`Table` of :class:`Field`
rows: name, bit width, optional bit offset (network order, bit 0 = the most
significant bit of byte 0), kind, optional enum type and a reserved flag.
Offsets are normalised once, when the table is built; the table then compiles
its fast paths into plain Python functions over one ``struct`` format, so a
decode is a single ``unpack_from`` plus shifts and masks, with no per-field
interpretation at run time:

* :meth:`Table.unpack` / :meth:`Table.pack` / :meth:`Table.pack_into`: the data
  path, positional values of the non-reserved fields in table order, no checks
  (the caller checks the buffer length once per packet);
* :meth:`Table.decode` / :meth:`Table.encode`: checked, by name, with ranges,
  enum membership, reserved-must-be-zero and length validated;
* :meth:`Table.dump`: Wireshark-like lines of names and values.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ibal.wire.layout import (
    BYTE_KINDS,
    Buffer,
    Field,
    Kind,
    Placed,
    Value,
    compile_layout,
)

__all__ = [
    "Buffer",
    "F",
    "Field",
    "FieldError",
    "Kind",
    "Placed",
    "R",
    "Table",
    "Value",
    "format_value",
]


class FieldError(ValueError):
    """A value does not fit its field, or a buffer does not fit its table.

    ``reason`` is a short machine-readable code (``short``, ``range``,
    ``enum``, ``reserved``, ``unknown``, ``missing``, ``type``); ``field`` the
    offending field's name, if any.
    """

    def __init__(self, reason: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.field = field


def F(
    name: str,
    bits: int,
    *,
    kind: Kind | None = None,
    enum: type[enum.IntEnum] | type[enum.IntFlag] | None = None,
    offset: int | None = None,
    title: str | None = None,
    hex: bool = False,
    default: Value | None = None,
) -> Field:
    """A field; the kind follows from ``enum`` (ENUM or FLAGS) unless given."""
    if kind is None:
        if enum is None:
            kind = Kind.UINT
        else:
            kind = Kind.FLAGS if issubclass(enum, _enum_flag()) else Kind.ENUM
    if default is None:
        default = bytes(bits // 8) if kind in BYTE_KINDS else 0
    return Field(name, bits, kind, enum, False, offset, title, hex, default)


def R(bits: int, *, name: str = "", offset: int | None = None) -> Field:
    """A reserved field: sent as zero, checked to be zero by :meth:`Table.validate`.

    Wider than 64 bits it is a run of whole bytes (e.g. the tail of a MAD).
    """
    kind = Kind.BYTES if bits > 64 else Kind.UINT
    return Field(name, bits, kind, None, True, offset)


def _enum_flag() -> type[enum.IntFlag]:
    return enum.IntFlag


class Table:
    """A compiled field table for one header or attribute."""

    def __init__(self, name: str, fields: Iterable[Field], *, size: int | None = None) -> None:
        self.name = name
        placed: list[tuple[Field, int]] = []
        pos = 0
        for n, f in enumerate(fields):
            if f.bits <= 0:
                raise ValueError(f"{name}.{f.name}: width must be positive")
            off = pos if f.offset is None else f.offset
            if off < pos:
                raise ValueError(f"{name}.{f.name or n}: overlaps the previous field")
            if f.reserved and not f.name:
                f = Field(f"resv_{off}", f.bits, f.kind, None, True, off)
            if f.kind in BYTE_KINDS:
                want = BYTE_KINDS[f.kind]
                if off % 8 or f.bits % 8 or (want is not None and f.bits != want):
                    raise ValueError(f"{name}.{f.name}: byte field must be whole, aligned bytes")
            elif f.bits > 64:
                raise ValueError(f"{name}.{f.name}: integer fields are at most 64 bits")
            placed.append((f, off))
            pos = off + f.bits
        names = [f.name for f, _ in placed]
        if len(set(names)) != len(names):
            raise ValueError(f"{name}: duplicate field names")
        if size is None:
            size = (pos + 7) // 8
        if size * 8 < pos:
            raise ValueError(f"{name}: fields end past the table size {size}")
        self.size = size
        # Compiled on first use (see __getattr__): a module of tables costs ~0.5 ms per
        # table at import, and a command uses few of them.
        self._placed: list[tuple[Field, int]] | None = placed

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not set yet: the codec _build makes.
        placed = self.__dict__.get("_placed")
        if placed is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        self._build(placed)  # two threads may both build: same result, either wins
        self._placed = None
        return getattr(self, name)

    def _build(self, placed: list[tuple[Field, int]]) -> None:
        c = compile_layout(self.name, placed, self.size)
        self.format = c.format
        self.fields: tuple[Placed, ...] = c.fields
        self.by_name: dict[str, Placed] = {p.name: p for p in self.fields}
        self.values: tuple[Placed, ...] = tuple(p for p in self.fields if not p.field.reserved)
        self.names: tuple[str, ...] = tuple(p.name for p in self.values)
        self.source = c.source
        self._resv_masks = c.resv_masks
        self._name_set = frozenset(self.names)
        self._checks = tuple((p.field, p.field.kind in BYTE_KINDS, p.mask) for p in self.values)
        # compiled at the first check: decode-only tables never pay for it
        self._checker: Callable[[Mapping[str, Value]], tuple[Value, ...]] = self._first_check
        self._resv_names = frozenset(p.name for p in self.fields if p.field.reserved)
        self._has_resv = bool(self._resv_names)
        top = self.size * 8
        self._resv_shifts = tuple(
            (p.name, top - p.offset - p.field.bits, p.mask) for p in self.fields if p.field.reserved
        )
        self.unpack: Callable[..., tuple[Any, ...]] = c.unpack
        self.pack: Callable[..., bytes] = c.pack
        self.pack_into: Callable[..., None] = c.pack_into
        self.load: Callable[[Buffer, int, Any], None] = c.load
        self.store: Callable[[Any, Buffer, int], None] = c.store

    @classmethod
    def concat(cls, name: str, tables: Sequence[Table]) -> Table:
        """One table made of several laid end to end (one compiled codec for all)."""
        out: list[Field] = []
        base = 0
        for t in tables:
            for p in t.fields:
                f = p.field
                out.append(
                    Field(
                        "" if f.reserved else f.name, f.bits, f.kind, f.enum, f.reserved,
                        base * 8 + p.offset, f.title, f.hex, f.default,
                    )
                )
            base += t.size
        return cls(name, out, size=base)

    # -- checked API ---------------------------------------------------------

    def __repr__(self) -> str:
        return f"<Table {self.name} {self.size} bytes {len(self.fields)} fields>"

    def decode(self, buf: Buffer, off: int = 0) -> dict[str, Value]:
        """All fields by name, reserved ones included; raises ``FieldError('short')``."""
        self._need(buf, off)
        vals = self.unpack(buf, off)
        out: dict[str, Value] = dict(zip(self.names, vals, strict=True))
        if self._has_resv:  # one big-int read for all reserved fields
            raw = int.from_bytes(buf[off : off + self.size], "big")
            for name, shift, mask in self._resv_shifts:
                out[name] = (raw >> shift) & mask
        return out

    def _extract(self, buf: Buffer, off: int, p: Placed) -> Value:
        raw = int.from_bytes(bytes(buf[off : off + self.size]), "big")
        return (raw >> (self.size * 8 - p.offset - p.field.bits)) & p.mask

    def _need(self, buf: Buffer, off: int) -> None:
        if off < 0 or len(buf) - off < self.size:
            raise FieldError(
                "short", f"{self.name}: need {self.size} bytes at {off}, have {len(buf) - off}"
            )

    def validate(self, buf: Buffer, off: int = 0, *, enums: bool = True) -> None:
        """Length, reserved-must-be-zero and (optionally) enum membership."""
        self._need(buf, off)
        if self._has_resv:
            for p in self.fields:
                if p.field.reserved and self._extract(buf, off, p):
                    raise FieldError("reserved", f"{self.name}.{p.name} is not zero", p.name)
        if enums:
            for p, v in zip(self.values, self.unpack(buf, off), strict=True):
                _check_enum(self.name, p.field, v)

    def check(self, values: Mapping[str, Value]) -> tuple[Value, ...]:
        """The positional values for :meth:`pack`, defaults filled in, each checked.

        Reserved fields (as :meth:`decode` returns them) are accepted when zero.
        """
        if not self._name_set.issuperset(values):
            unknown = set(values) - self._name_set
            for n in unknown & self._resv_names:  # what decode() gave back: zero is fine
                if values[n]:
                    raise FieldError("reserved", f"{self.name}.{n} is not zero", n)
            unknown -= self._resv_names
            if unknown:
                raise FieldError("unknown", f"{self.name}: unknown fields {sorted(unknown)}")
        return self._checker(values)

    def _check_one(self, i: int, v: Any) -> Value:
        """Value ``i`` (of :attr:`values`) checked and made plain (``bytes``, ``int``), or
        the ``FieldError`` that says why not: the compiled checker's slow path."""
        f, is_bytes, mask = self._checks[i]
        if is_bytes:
            if not isinstance(v, (bytes, bytearray, memoryview)):
                raise FieldError("type", f"{self.name}.{f.name}: expected bytes", f.name)
            b = bytes(v)
            if len(b) != f.bits // 8:
                raise FieldError("range", f"{self.name}.{f.name}: need {f.bits // 8} bytes", f.name)
            return b
        if not isinstance(v, int) or (isinstance(v, bool) and f.bits != 1):
            raise FieldError("type", f"{self.name}.{f.name}: expected int", f.name)
        if not 0 <= v <= mask:
            raise FieldError(
                "range", f"{self.name}.{f.name}={v} does not fit {f.bits} bits", f.name
            )
        _check_enum(self.name, f, v)
        return int(v)

    def _first_check(self, values: Mapping[str, Value]) -> tuple[Value, ...]:
        self._checker = self._compile_checker()
        return self._checker(values)

    def _compile_checker(self) -> Callable[[Mapping[str, Value]], tuple[Value, ...]]:
        """One straight-line function for :meth:`check`: per field a ``get``, one test
        that passes for a plain value in range (an ``int`` in its enum, ``bytes`` of the
        right length), and :meth:`_check_one` for anything else."""
        ns: dict[str, Any] = {"slow": self._check_one}
        lines = ["def check(values):", "    get = values.get"]
        for i, (f, is_bytes, mask) in enumerate(self._checks):
            ns[f"d{i}"] = f.default
            lines.append(f"    v{i} = get({f.name!r}, d{i})")
            if is_bytes:
                ok = f"type(v{i}) is bytes and len(v{i}) == {f.bits // 8}"
            else:
                ok = f"type(v{i}) is int and 0 <= v{i} <= {mask}"
                if f.enum is not None and f.kind is Kind.ENUM:
                    ns[f"e{i}"] = frozenset(int(m) for m in f.enum)
                    ok += f" and v{i} in e{i}"
                elif f.enum is not None and f.kind is Kind.FLAGS:
                    allowed = 0
                    for m in f.enum:
                        allowed |= int(m)
                    ok += f" and not v{i} & {~allowed & mask}"
            lines.append(f"    if not ({ok}):")
            lines.append(f"        v{i} = slow({i}, v{i})")
        lines.append("    return (" + "".join(f"v{i}, " for i in range(len(self._checks))) + ")")
        exec(compile("\n".join(lines), f"<field table {self.name} check>", "exec"), ns)
        return ns["check"]  # type: ignore[no-any-return]

    def encode(self, values: Mapping[str, Value] | None = None, /, **kw: Value) -> bytes:
        """Checked encode by name; omitted fields take their defaults."""
        merged = dict(values or {}, **kw)
        return self.pack(*self.check(merged))

    def encode_decoded(self, values: Mapping[str, Value]) -> tuple[bytes, dict[str, Value]]:
        """:meth:`encode`, and the fields :meth:`decode` would read back from its bytes
        (plain values, reserved ones zero), from the one check: no decode of what was
        just encoded."""
        checked = self.check(values)
        out: dict[str, Value] = dict(zip(self.names, checked, strict=True))
        for name, _shift, _mask in self._resv_shifts:
            out[name] = 0
        return self.pack(*checked), out

    def dump(self, buf: Buffer, off: int = 0, indent: str = "    ") -> str:
        """The header as Wireshark-like lines: a title, then ``name: value`` per field."""
        d = self.decode(buf, off)
        lines = [f"{self.name}"]
        for p in self.fields:
            if p.field.reserved and not d[p.name]:
                continue
            lines.append(f"{indent}{p.field.title or p.name}: {format_value(p.field, d[p.name])}")
        return "\n".join(lines)


def _check_enum(table: str, f: Field, v: Value) -> None:
    if f.enum is None or not isinstance(v, int):
        return
    if f.kind is Kind.ENUM:
        try:
            f.enum(v)
        except ValueError:
            msg = f"{table}.{f.name}: {v!r} is not a {f.enum.__name__}"
            raise FieldError("enum", msg, f.name) from None
    elif f.kind is Kind.FLAGS:
        allowed = 0
        for m in f.enum:
            allowed |= int(m)
        if v & ~allowed:
            msg = f"{table}.{f.name}: unknown flag bits {v & ~allowed:#x}"
            raise FieldError("enum", msg, f.name)


def format_value(f: Field, v: Value) -> str:
    """One value as a person reads it: enum names, dotted IPs, hex where asked."""
    if isinstance(v, bytes):
        if f.kind in (Kind.GID, Kind.IPV6):
            a6 = ipaddress.IPv6Address(v)
            # RoCE GIDs are mostly IPv4-mapped: print them as tools do
            return f"::ffff:{a6.ipv4_mapped}" if a6.ipv4_mapped else str(a6)
        if f.kind is Kind.IPV4:
            return str(ipaddress.IPv4Address(v))
        if f.kind is Kind.MAC:
            return ":".join(f"{b:02x}" for b in v)
        return v.hex() if len(v) <= 32 else f"{v[:32].hex()}... ({len(v)} bytes)"
    width = (f.bits + 3) // 4
    num = f"{v:#0{width + 2}x}" if f.hex else str(v)
    if f.enum is not None:
        try:
            member = f.enum(v)
        except ValueError:
            return f"unknown ({v:#x})"
        name = member.name if member.name is not None else str(member)
        return f"{name} ({v:#x})"
    return num


