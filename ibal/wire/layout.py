"""The field-table compiler: rows with bit offsets -> one struct format and generated code.

:class:`~ibal.wire.fields.Table` hands :func:`compile_layout` its rows with
normalised offsets; this module groups them into byte-aligned words read by one
``struct`` format and generates the Python source of the fast paths (``unpack``,
``pack``, ``pack_into``, and ``load``/``store`` over a record whose attributes
are named like the fields), compiled once per table.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Sequence
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


BYTE_KINDS = {Kind.BYTES: None, Kind.GID: 128, Kind.IPV4: 32, Kind.IPV6: 128, Kind.MAC: 48}


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



@dataclass(frozen=True)
class Compiled:
    """What :func:`compile_layout` produces for one table."""

    format: str
    fields: tuple[Placed, ...]
    resv_masks: tuple[int, ...]  # reserved bits per word, for validation
    source: str  # the generated code, for reading and debugging
    unpack: Callable[..., tuple[Any, ...]]
    pack: Callable[..., bytes]
    pack_into: Callable[..., None]
    load: Callable[[Buffer, int, Any], None]
    store: Callable[[Any, Buffer, int], None]


def compile_layout(name: str, placed: Sequence[tuple[Field, int]], size: int) -> Compiled:
    """Lay out ``placed`` (fields with bit offsets, in order) in ``size`` bytes and compile it."""
    containers = _containers(placed)
    fmt = [">"]
    exprs: list[str] = []  # each word's value in terms of struct items _0, _1, ...
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
        sub = []
        rest = c.size * 8
        for part in _split(c.size):
            fmt.append(_ITEM[part])
            rest -= part * 8
            sub.append((n_items, rest))
            n_items += 1
        exprs.append(" | ".join(f"(_{i} << {s})" if s else f"_{i}" for i, s in sub))
    if size > pos:
        fmt.append(f"{size - pos}x")
    st = struct.Struct("".join(fmt))
    assert st.size == size, (st.format, size)
    fields = tuple(
        Placed(f, off, ci, 0 if c.is_bytes else (c.start + c.size) * 8 - off - f.bits,
               (1 << f.bits) - 1)
        for ci, c in enumerate(containers)
        for f, off in c.fields
    )  # fmt: skip
    values = [p for p in fields if not p.field.reserved]
    resv = [0] * len(containers)
    for p in fields:
        if p.field.reserved and not containers[p.item].is_bytes:
            resv[p.item] |= p.mask << p.shift
    src = "\n".join(
        _decoder(containers, exprs, n_items, values)
        + _encoder(containers, values)
        + _record_io([p.name for p in values])
    )
    ns: dict[str, Any] = {
        "_unpack_from": st.unpack_from,
        "_pack": st.pack,
        "_pack_into": st.pack_into,
    }
    exec(compile(src, f"<field table {name}>", "exec"), ns)
    return Compiled(
        st.format, fields, tuple(resv), src,
        ns["unpack"], ns["pack"], ns["pack_into"], ns["load"], ns["store"],
    )  # fmt: skip


def _decoder(
    containers: list[_Container], exprs: list[str], n_items: int, values: list[Placed]
) -> list[str]:
    """``unpack``: one ``unpack_from``, rebuild odd-sized words, shift and mask each field."""
    if n_items == 0:
        return ["def unpack(buf, off=0):", "    return ()"]
    items = ", ".join(f"_{i}" for i in range(n_items)) + ","
    cvals = [f"c{i}" for i in range(len(containers))]
    dec = ["def unpack(buf, off=0):", f"    {items} = _unpack_from(buf, off)"]
    for i, e in enumerate(exprs):
        if e.isidentifier():
            cvals[i] = e  # a one-item word needs no temporary
        else:
            dec.append(f"    {cvals[i]} = {e}")
    outs = []
    for p in values:
        v = cvals[p.item]
        if containers[p.item].is_bytes:
            outs.append(v)
        elif p.field.kind is Kind.BOOL:
            outs.append(f"({v} & {1 << p.shift:#x} != 0)")
        else:
            # no mask needed when the field reaches the word's top bit
            top = p.shift + p.field.bits == containers[p.item].size * 8
            expr = v if p.shift == 0 else f"({v} >> {p.shift})"
            outs.append(expr if top else f"({expr} & {p.mask:#x})")
    dec.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    return dec


def _encoder(containers: list[_Container], values: list[Placed]) -> list[str]:
    """``pack``/``pack_into``: value fields or-ed into their words; reserved bits stay zero."""
    args = ", ".join(f"v{i}" for i in range(len(values)))
    per: list[list[str]] = [[] for _ in containers]
    for i, p in enumerate(values):
        per[p.item].append(f"(v{i} << {p.shift})" if p.shift else f"v{i}")
    item_exprs: list[str] = []
    for ci, c in enumerate(containers):
        val = " | ".join(per[ci]) or ("b''" if c.is_bytes else "0")
        if c.is_bytes or c.size in _ITEM:
            item_exprs.append(val)
            continue
        rest = c.size * 8
        for part in _split(c.size):
            rest -= part * 8
            item_exprs.append(f"((({val}) >> {rest}) & {(1 << part * 8) - 1:#x})")
    body = ", ".join(item_exprs)
    lead = f"buf, off, {args}" if args else "buf, off"
    tail = f", {body}" if body else ""
    return [
        f"def pack({args}):",
        f"    return _pack({body})",
        f"def pack_into({lead}):",
        f"    _pack_into(buf, off{tail})",
    ]


def _record_io(names: list[str]) -> list[str]:
    """``load``/``store``: the codec over an object whose attributes are named like the
    fields (e.g. a ``__slots__`` packet record)."""
    if not names:
        return ["def load(buf, off, obj):", "    pass",
                "def store(obj, buf, off):", "    pack_into(buf, off)"]  # fmt: skip
    attrs = ", ".join(f"obj.{n}" for n in names)
    return [
        "def load(buf, off, obj):",
        f"    {attrs}{',' if len(names) == 1 else ''} = unpack(buf, off)",
        "def store(obj, buf, off):",
        f"    pack_into(buf, off, {attrs})",
    ]


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
        if f.kind in BYTE_KINDS:
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
