"""The field-table engine: layout compilation, codecs, validation, dump."""

from __future__ import annotations

import enum

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibal.wire.fields import F, FieldError, Kind, R, Table


class Colour(enum.IntEnum):
    RED = 1
    GREEN = 2


class Opts(enum.IntFlag):
    A = 1
    B = 4


def reference_decode(table: Table, raw: bytes) -> dict[str, int | bytes]:
    """Bit-by-bit reading of a big-endian buffer: the definition the compiler must meet."""
    big = int.from_bytes(raw[: table.size], "big")
    out: dict[str, int | bytes] = {}
    for p in table.fields:
        if p.field.kind in (Kind.BYTES, Kind.GID, Kind.IPV4, Kind.IPV6, Kind.MAC):
            out[p.name] = raw[p.offset // 8 : (p.offset + p.field.bits) // 8]
        else:
            v = (big >> (table.size * 8 - p.offset - p.field.bits)) & ((1 << p.field.bits) - 1)
            out[p.name] = bool(v) if p.field.kind is Kind.BOOL else v
    return out


def test_bth_layout_compiles_to_three_words() -> None:
    bth = Table("BTH", [
        F("opcode", 8), F("se", 1, kind=Kind.BOOL), F("m", 1), F("pad", 2), F("tver", 4),
        F("pkey", 16), F("fecn", 1), F("becn", 1), R(6), F("qpn", 24),
        F("ackreq", 1), R(7), F("psn", 24),
    ])  # fmt: skip
    assert bth.format == ">III"
    assert bth.size == 12
    raw = bth.encode(opcode=4, se=True, pad=3, pkey=0xFFFF, qpn=0x123456, ackreq=1, psn=0xABCDEF)
    assert raw.hex() == "04b0ffff0012345680abcdef"
    assert bth.decode(raw) == {
        "opcode": 4, "se": True, "m": 0, "pad": 3, "tver": 0, "pkey": 0xFFFF, "fecn": 0,
        "becn": 0, "qpn": 0x123456, "ackreq": 1, "psn": 0xABCDEF, "resv_34": 0, "resv_65": 0,
    }  # fmt: skip
    assert bth.unpack(raw)[1] is True  # BOOL decodes as bool


def test_mixed_widths_get_struct_items_of_their_size() -> None:
    assert Table("A", [F("s", 8), F("msn", 24)]).format == ">I"
    assert Table("X", [F("va", 64), F("k", 32), F("s", 64), F("c", 64)]).format == ">QIQQ"
    # a 3-byte word is read as B + H and recombined; bytes no field uses are pad
    assert Table("T", [F("a", 24)]).format == ">BH"
    assert Table("T", [F("a", 16), F("b", 8, offset=48)]).format == ">H4xB"
    # an odd-sized word grows to take in the next field: a 6-byte word, H + I
    t = Table("T", [F("a", 24), F("b", 8, offset=40)])
    assert t.format == ">HI"
    raw = t.encode(a=0xABCDEF, b=7)
    assert raw == bytes.fromhex("abcdef000007")
    assert t.unpack(raw) == (0xABCDEF, 7)


def test_byte_kinds_and_dump() -> None:
    t = Table("Addr", [
        F("colour", 8, enum=Colour), F("opts", 8, enum=Opts), F("ip", 32, kind=Kind.IPV4),
        F("gid", 128, kind=Kind.GID, title="GID"), F("mac", 48, kind=Kind.MAC),
        F("key", 16, hex=True),
    ])  # fmt: skip
    assert t.fields[1].field.kind is Kind.FLAGS
    gid = bytes(10) + b"\xff\xff" + bytes((10, 0, 0, 1))
    raw = t.encode(colour=2, opts=5, ip=bytes((1, 2, 3, 4)), gid=gid, mac=b"\x02" * 6, key=0xAB)
    assert len(raw) == t.size == 1 + 1 + 4 + 16 + 6 + 2
    text = t.dump(raw)
    assert "colour: GREEN (0x2)" in text
    assert "ip: 1.2.3.4" in text
    assert "GID: ::ffff:10.0.0.1" in text
    assert "mac: 02:02:02:02:02:02" in text
    assert "key: 0x00ab" in text


def test_checked_encode_rejects_bad_values() -> None:
    t = Table("T", [F("a", 4), F("c", 8, enum=Colour), F("o", 8, enum=Opts), R(4),
                    F("b", 16, kind=Kind.BYTES)])  # fmt: skip
    cases = [
        ({"a": 16}, "range", "a"),
        ({"a": -1}, "range", "a"),
        ({"c": 3}, "enum", "c"),
        ({"o": 2}, "enum", "o"),
        ({"b": b"abc"}, "range", "b"),
        ({"b": 5}, "type", "b"),
        ({"a": b"x"}, "type", "a"),
        ({"zz": 1}, "unknown", None),
    ]
    for values, reason, field in cases:
        with pytest.raises(FieldError) as e:
            t.encode({"c": 1, **values})
        assert (e.value.reason, e.value.field) == (reason, field), values
    assert t.encode(c=1) == bytes.fromhex("00100000" + "00")[: t.size]


def test_check_gives_plain_values_for_enum_bool_and_buffer_inputs() -> None:
    """The compiled checker's fast path takes plain ints and bytes; anything else goes the
    slow way and comes back plain (``pack`` and the caller's dicts see ints and bytes)."""
    t = Table("T", [F("c", 8, enum=Colour), F("o", 8, enum=Opts), F("n", 16),
                    F("b", 16, kind=Kind.BYTES), F("f", 1, kind=Kind.BOOL)])  # fmt: skip
    got = t.check({"c": Colour.GREEN, "o": Opts.A | Opts.B, "f": True, "n": 7,
                   "b": bytearray(b"xy")})  # fmt: skip
    assert got == (2, 5, 7, b"xy", 1)
    assert [type(v) for v in got] == [int, int, int, bytes, int]
    assert t.check({"c": 1, "o": 4, "b": memoryview(b"ab")}) == (1, 4, 0, b"ab", 0)
    with pytest.raises(FieldError) as e:
        t.check({"c": 1, "n": True})  # a bool is no 16-bit number
    assert (e.value.reason, e.value.field) == ("type", "n")
    with pytest.raises(FieldError) as e:
        t.check({"c": 1, "o": 4 | 8})
    assert (e.value.reason, e.value.field) == ("enum", "o")


def test_validate_and_short_buffers() -> None:
    t = Table("T", [F("a", 8), R(8), F("c", 8, enum=Colour)])
    t.validate(bytes((1, 0, 1)))
    with pytest.raises(FieldError) as e:
        t.validate(bytes((1, 0x40, 1)))
    assert e.value.reason == "reserved"
    with pytest.raises(FieldError) as e:
        t.validate(bytes((1, 0, 9)))
    assert e.value.reason == "enum"
    t.validate(bytes((1, 0, 9)), enums=False)
    with pytest.raises(FieldError) as e:
        t.decode(b"\x01\x00")
    assert e.value.reason == "short"
    assert t.decode(b"\xff\x01\x02\x03", 1) == {"a": 1, "c": 3, "resv_8": 2}
    assert "resv_8: 2" in t.dump(bytes((1, 2, 1)))


def test_bad_tables_fail_at_build_time() -> None:
    with pytest.raises(ValueError, match="overlaps"):
        Table("T", [F("a", 8), F("b", 8, offset=4)])
    with pytest.raises(ValueError, match="whole, aligned"):
        Table("T", [F("a", 4), F("b", 16, kind=Kind.BYTES)])
    with pytest.raises(ValueError, match="duplicate"):
        Table("T", [F("a", 8), F("a", 8)])
    with pytest.raises(ValueError, match="past the table size"):
        Table("T", [F("a", 16)], size=1)


def test_tables_without_value_fields() -> None:
    pad = Table("Pad", [], size=4)
    assert (pad.format, pad.encode(), pad.unpack(b"abcd")) == (">4x", bytes(4), ())
    resv = Table("Resv", [R(8), R(24)])
    assert resv.encode() == bytes(4) and resv.names == ()
    buf = bytearray(b"\xff" * 4)
    resv.store(object(), buf, 0)
    assert buf == bytes(4)
    with pytest.raises(FieldError):
        resv.validate(b"\0\0\0\1")


def test_concat_and_record_binding() -> None:
    a = Table("A", [F("x", 8), R(8), F("y", 16)])
    b = Table("B", [F("z", 64)])
    ab = Table.concat("AB", [a, b])
    assert ab.size == 12 and ab.names == ("x", "y", "z")

    class Rec:
        __slots__ = ("x", "y", "z")

    r = Rec()
    ab.load(bytes.fromhex("01ff0203") + (5).to_bytes(8, "big"), 0, r)
    assert (r.x, r.y, r.z) == (1, 0x0203, 5)
    buf = bytearray(14)
    ab.store(r, buf, 2)
    assert buf.hex() == "0000" + "01000203" + "0000000000000005"  # reserved sent as zero


@st.composite
def tables_and_values(draw: st.DrawFn) -> tuple[Table, dict[str, int | bytes]]:
    fields = []
    pos = 0
    for i in range(draw(st.integers(1, 10))):
        pos += draw(st.sampled_from([0, 0, 0, 1, 3, 8]))  # gaps
        if draw(st.integers(0, 5)) == 0:
            pos = (pos + 7) // 8 * 8
            fields.append(F(f"b{i}", 8 * draw(st.integers(1, 5)), kind=Kind.BYTES, offset=pos))
        elif draw(st.integers(0, 6)) == 0:
            fields.append(R(draw(st.integers(1, 12)), offset=pos))
        else:
            fields.append(F(f"f{i}", draw(st.integers(1, 64)), offset=pos))
        pos = fields[-1].offset + fields[-1].bits  # type: ignore[operator]
    table = Table("H", fields)
    values: dict[str, int | bytes] = {}
    for p in table.values:
        if p.field.kind is Kind.BYTES:
            values[p.name] = draw(st.binary(min_size=p.field.bits // 8, max_size=p.field.bits // 8))
        else:
            values[p.name] = draw(st.integers(0, (1 << p.field.bits) - 1))
    return table, values


@settings(max_examples=300, deadline=None)
@given(tables_and_values())
def test_compiled_codec_matches_bitwise_reference(
    case: tuple[Table, dict[str, int | bytes]],
) -> None:
    table, values = case
    raw = table.encode(values)
    assert len(raw) == table.size
    ref = reference_decode(table, raw)
    for name, v in values.items():
        assert ref[name] == v, name
    for p in table.fields:
        if p.field.reserved:
            assert ref[p.name] == 0
    assert table.unpack(raw) == tuple(values[n] for n in table.names)
    # decoding from an offset inside a larger buffer, and pack_into at an offset
    buf = bytearray(3 + table.size)
    table.pack_into(buf, 3, *table.unpack(raw))
    assert bytes(buf[3:]) == raw
    assert table.decode(memoryview(bytes(buf)), 3) == {**ref}


def test_a_table_compiled_on_first_use_from_many_threads_decodes_alike() -> None:
    # tables compile their codec lazily; threads racing to the first use all get it right
    import threading

    raw = bytes([0x5A, 0xBC, 0x12, 0x34, 0, 0xAB, 0xCD, 0xEF])
    want = {"a": 5, "b": 0xABC, "c": 0x1234, "d": 0xABCDEF}
    t2 = Table("Lazy", [F("a", 4), F("b", 12), F("c", 16, hex=True), R(8), F("d", 24)])
    start = threading.Barrier(8)
    got: list[object] = []

    def use() -> None:
        start.wait()
        vals = {k: v for k, v in t2.decode(raw).items() if not k.startswith("resv")}
        got.append((vals, t2.encode(**want)))

    threads = [threading.Thread(target=use) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert got == [(want, raw)] * 8
    with pytest.raises(AttributeError):
        t2.no_such_attribute  # noqa: B018
