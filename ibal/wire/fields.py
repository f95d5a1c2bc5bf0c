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
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Buffer = bytes | bytearray | memoryview
Value = int | bytes  # bool is an int


class Kind(enum.Enum):
    """How a field's value is represented and printed."""

    UINT = "uint"
    BOOL = "bool"  # one bit, decoded as bool
    ENUM = "enum"
    FLAGS = "flags"
    BYTES = "bytes"
    GID = "gid"  # 16 bytes, printed as an IPv6 address
    IPV4 = "ipv4"  # 4 bytes, dotted quad
    IPV6 = "ipv6"  # 16 bytes
    MAC = "mac"  # 6 bytes


_BYTE_KINDS = {Kind.BYTES: None, Kind.GID: 128, Kind.IPV4: 32, Kind.IPV6: 128, Kind.MAC: 48}


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


@dataclass(frozen=True)
class Field:
    """One row of a table.  ``offset`` is in bits; ``None`` follows the previous field."""

    name: str
    bits: int
    kind: Kind = Kind.UINT
    enum: type[enum.IntEnum] | type[enum.IntFlag] | None = None
    reserved: bool = False
    offset: int | None = None
    title: str | None = None
    hex: bool = False
    default: Value = 0


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
        default = bytes(bits // 8) if kind in _BYTE_KINDS else 0
    return Field(name, bits, kind, enum, False, offset, title, hex, default)


def R(bits: int, *, name: str = "", offset: int | None = None) -> Field:
    """A reserved field: sent as zero, checked to be zero by :meth:`Table.validate`."""
    return Field(name, bits, Kind.UINT, None, True, offset)


def _enum_flag() -> type[enum.IntFlag]:
    return enum.IntFlag


@dataclass(frozen=True)
class Placed:
    """A field with its normalised bit offset and its place in the compiled layout."""

    field: Field
    offset: int  # bits from the start of the table
    item: int  # index of the struct item (container) that holds it
    shift: int  # right shift inside that container
    mask: int  # mask after the shift

    @property
    def name(self) -> str:
        return self.field.name


@dataclass
class _Container:
    start: int  # byte offset
    size: int  # bytes
    fields: list[tuple[Field, int]]  # (field, bit offset)
    is_bytes: bool = False


_ITEM = {1: "B", 2: "H", 4: "I", 8: "Q"}
_SPLIT = {3: (1, 2), 5: (1, 4), 6: (2, 4), 7: (1, 2, 4)}


def _split(size: int) -> tuple[int, ...]:
    """Struct item sizes that read a ``size``-byte word (odd words: several items)."""
    if size in _ITEM:
        return (size,)
    if size in _SPLIT:
        return _SPLIT[size]
    return (8, *_split(size - 8))


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
            if f.kind in _BYTE_KINDS:
                want = _BYTE_KINDS[f.kind]
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
        self._build(placed)

    # -- layout --------------------------------------------------------------

    def _build(self, placed: list[tuple[Field, int]]) -> None:
        containers = _containers(placed)
        fmt = [">"]
        # For each container: the expression of its value in terms of struct items.
        exprs: list[str] = []
        n_items = 0
        pos = 0
        for c in containers:
            if c.start > pos:
                fmt.append(f"{c.start - pos}x")
            pos = c.start + c.size
            if c.is_bytes:
                fmt.append(f"{c.size}s")
                exprs.append(f"_{n_items}")
                n_items += 1
                continue
            parts = _split(c.size)
            sub = []
            rest = c.size * 8
            for p in parts:
                fmt.append(_ITEM[p])
                rest -= p * 8
                sub.append((n_items, rest))
                n_items += 1
            exprs.append(" | ".join(f"(_{i} << {s})" if s else f"_{i}" for i, s in sub))
        if self.size > pos:
            fmt.append(f"{self.size - pos}x")
        self.format = "".join(fmt)
        self._struct = struct.Struct(self.format)
        assert self._struct.size == self.size, (self.format, self.size)

        self.fields: tuple[Placed, ...] = tuple(
            Placed(
                f,
                off,
                ci,
                0 if c.is_bytes else (c.start + c.size) * 8 - off - f.bits,
                (1 << f.bits) - 1,
            )
            for ci, c in enumerate(containers)
            for f, off in c.fields
        )
        self.by_name: dict[str, Placed] = {p.name: p for p in self.fields}
        self.values: tuple[Placed, ...] = tuple(p for p in self.fields if not p.field.reserved)
        self.names: tuple[str, ...] = tuple(p.name for p in self.values)
        self._compile(containers, exprs, n_items)

    def _compile(self, containers: list[_Container], exprs: list[str], n_items: int) -> None:
        items = ", ".join(f"_{i}" for i in range(n_items)) + ","
        cvals = [f"c{i}" for i in range(len(containers))]
        # decode: unpack items, rebuild containers, then extract each value field.
        dec = ["def unpack(buf, off=0):", f"    {items} = _unpack_from(buf, off)"]
        for i, e in enumerate(exprs):
            if e.isidentifier():
                cvals[i] = e  # a one-item word needs no temporary
            else:
                dec.append(f"    {cvals[i]} = {e}")
        outs = []
        for p in self.values:
            v = cvals[p.item]
            if containers[p.item].is_bytes:
                outs.append(v)
                continue
            if p.field.kind is Kind.BOOL:
                outs.append(f"({v} & {1 << p.shift:#x} != 0)")
                continue
            # no mask needed when the field reaches the container's top bit
            top = p.shift + p.field.bits == containers[p.item].size * 8
            expr = v if p.shift == 0 else f"({v} >> {p.shift})"
            outs.append(expr if top else f"({expr} & {p.mask:#x})")
        dec.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
        # reserved bits per container, for validate()
        resv_masks = [0] * len(containers)
        for p in self.fields:
            if p.field.reserved and not containers[p.item].is_bytes:
                resv_masks[p.item] |= p.mask << p.shift
        self._resv_masks = tuple(resv_masks)

        # encode: combine value fields into containers (reserved bits stay zero).
        args = ", ".join(f"v{i}" for i in range(len(self.values)))
        per: list[list[str]] = [[] for _ in containers]
        for i, p in enumerate(self.values):
            per[p.item].append(f"(v{i} << {p.shift})" if p.shift else f"v{i}")
        item_exprs: list[str] = []
        for ci, c in enumerate(containers):
            val = " | ".join(per[ci]) or ("b''" if c.is_bytes else "0")
            if c.is_bytes or c.size in _ITEM:
                item_exprs.append(val)
                continue
            rest = c.size * 8
            for p_ in _split(c.size):
                rest -= p_ * 8
                item_exprs.append(f"((({val}) >> {rest}) & {(1 << p_ * 8) - 1:#x})")
        body = ", ".join(item_exprs)
        enc = [
            f"def pack({args}):",
            f"    return _pack({body})",
            f"def pack_into(buf, off, {args}):" if args else "def pack_into(buf, off):",
            f"    _pack_into(buf, off, {body})",
        ]
        ns: dict[str, Any] = {
            "_unpack_from": self._struct.unpack_from,
            "_pack": self._struct.pack,
            "_pack_into": self._struct.pack_into,
        }
        self.source = "\n".join(dec + enc + self._record_source(containers))
        exec(compile(self.source, f"<field table {self.name}>", "exec"), ns)
        self.unpack: Callable[..., tuple[Any, ...]] = ns["unpack"]
        self.pack: Callable[..., bytes] = ns["pack"]
        self.pack_into: Callable[..., None] = ns["pack_into"]
        self.load: Callable[[Buffer, int, Any], None] = ns["load"]
        self.store: Callable[[Any, Buffer, int], None] = ns["store"]

    def _record_source(self, containers: list[_Container]) -> list[str]:
        """``load``/``store``: the same codec over an object whose attributes
        are named like the fields (e.g. a ``__slots__`` packet record)."""
        targets = ", ".join(f"obj.{n}" for n in self.names)
        args = ", ".join(f"obj.{n}" for n in self.names)
        if not self.names:
            return ["def load(buf, off, obj):", "    pass",
                    "def store(obj, buf, off):", "    _pack_into(buf, off)"]
        return [
            "def load(buf, off, obj):",
            f"    {targets}{',' if len(self.names) == 1 else ''} = unpack(buf, off)",
            "def store(obj, buf, off):",
            f"    pack_into(buf, off, {args})",
        ]

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
        if len(self.values) != len(self.fields):
            for p in self.fields:
                if p.field.reserved:
                    out[p.name] = self._extract(buf, off, p)
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
        if any(self._resv_masks):
            for p in self.fields:
                if p.field.reserved and self._extract(buf, off, p):
                    raise FieldError("reserved", f"{self.name}.{p.name} is not zero", p.name)
        if enums:
            for p, v in zip(self.values, self.unpack(buf, off), strict=True):
                _check_enum(self.name, p.field, v)

    def check(self, values: Mapping[str, Value]) -> tuple[Value, ...]:
        """The positional values for :meth:`pack`, defaults filled in, each checked."""
        unknown = set(values) - set(self.names)
        if unknown:
            raise FieldError("unknown", f"{self.name}: unknown fields {sorted(unknown)}")
        out: list[Value] = []
        for p in self.values:
            f = p.field
            v = values.get(f.name, f.default)
            if f.kind in _BYTE_KINDS:
                if not isinstance(v, bytes | bytearray | memoryview):
                    raise FieldError("type", f"{self.name}.{f.name}: expected bytes", f.name)
                v = bytes(v)
                if len(v) != f.bits // 8:
                    raise FieldError(
                        "range", f"{self.name}.{f.name}: need {f.bits // 8} bytes", f.name
                    )
            else:
                if not isinstance(v, int) or (isinstance(v, bool) and f.bits != 1):
                    raise FieldError("type", f"{self.name}.{f.name}: expected int", f.name)
                if not 0 <= v <= p.mask:
                    raise FieldError(
                        "range", f"{self.name}.{f.name}={v} does not fit {f.bits} bits", f.name
                    )
                _check_enum(self.name, f, v)
                v = int(v)
            out.append(v)
        return tuple(out)

    def encode(self, values: Mapping[str, Value] | None = None, /, **kw: Value) -> bytes:
        """Checked encode by name; omitted fields take their defaults."""
        merged = dict(values or {}, **kw)
        return self.pack(*self.check(merged))

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


def _containers(placed: Sequence[tuple[Field, int]]) -> list[_Container]:
    """Group fields into byte-aligned struct items.

    Integer fields are packed greedily into words of up to 32 bits (64 when a
    word would otherwise end on an odd size, or a field needs it), so a BTH is
    three 32-bit words; bits of a word no field claims are sent as zero.  A
    word never ends inside a byte another field uses, so a chain of unaligned
    fields makes one longer word (read as several items, combined as a Python
    int).  Byte-string fields are items of their own; bytes no field covers
    become struct pad bytes.
    """
    out: list[_Container] = []
    cur: list[tuple[Field, int]] = []

    def close() -> None:
        if cur:
            start = cur[0][1] // 8
            end = (cur[-1][1] + cur[-1][0].bits + 7) // 8
            out.append(_Container(start, end - start, list(cur)))
            cur.clear()

    for f, off in placed:
        if f.kind in _BYTE_KINDS:
            close()
            out.append(_Container(off // 8, f.bits // 8, [(f, off)], is_bytes=True))
            continue
        if cur:
            start = cur[0][1] // 8 * 8
            last_end = cur[-1][1] + cur[-1][0].bits
            span = off + f.bits - start
            size = (last_end + 7) // 8 - start // 8
            if off < (last_end + 7) // 8 * 8:  # shares a byte with the open word
                cur.append((f, off))
                continue
            if span <= 32 or (size not in _ITEM and span <= 64):
                cur.append((f, off))
                continue
            close()
        cur.append((f, off))
    close()
    return out
