"""ibal.records.record behaves as the dataclass it replaces (repr, equality, hashing, frozen)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ibal.memo import derived
from ibal.records import record
from ibal.types import CaAttr, Gid, GidEntry, GidType, MadAddr, PortAttr


def _pair(frozen: bool) -> tuple[Any, Any]:
    def body(name: str) -> type:
        return type(name, (), {"__annotations__": {"a": "int", "b": "Any", "c": "int"},
                               "b": None, "c": dataclasses.field(default=0, compare=False,
                                                                 repr=False)})  # fmt: skip

    dc = dataclasses.dataclass(body("R"), frozen=frozen, slots=True)
    rec = record(body("R"), frozen=frozen)
    return dc, rec


@pytest.mark.parametrize("frozen", [True, False])
def test_record_matches_the_generated_methods(frozen: bool) -> None:
    dc, rec = _pair(frozen)
    for args in ((1,), (1, [2]), (1, "x", 5), (0, None, 9)):
        d, r = dc(*args), rec(*args)
        assert repr(r) == repr(d)
        assert (r == rec(*args)) is (d == dc(*args)) is True
        assert (r == rec(args[0] + 1)) is (d == dc(args[0] + 1)) is False
        assert (r != rec(*args)) is False
        assert r.__eq__(d) is NotImplemented  # another class: not equal, as a dataclass
        assert r != d
    # a field with compare=False is left out of equality and hashing, as in the dataclass
    assert rec(1, 2, 3) == rec(1, 2, 4)
    assert rec.__match_args__ == dc.__match_args__ and rec.__slots__ == dc.__slots__
    assert [f.name for f in dataclasses.fields(rec)] == ["a", "b", "c"]
    assert dataclasses.replace(rec(1, 2), a=7) == rec(7, 2)
    if frozen:
        assert hash(rec(1, 2)) == hash(dc(1, 2)) == hash((1, 2))
        with pytest.raises(dataclasses.FrozenInstanceError):
            rec(1).a = 2
    else:
        with pytest.raises(TypeError, match="unhashable"):
            hash(rec(1))
        r = rec(1)
        r.a = 5
        assert r == rec(5)


def test_hash_follows_field_hash_as_in_a_dataclass() -> None:
    def body(name: str) -> type:
        return type(name, (), {"__annotations__": {"a": "int", "b": "int"},
                               "b": dataclasses.field(default=0, hash=False)})  # fmt: skip

    dc = dataclasses.dataclass(body("H"), frozen=True, slots=True)
    rec = record(body("H"), frozen=True)
    assert hash(rec(1, 2)) == hash(dc(1, 2)) == hash(rec(1, 3)) == hash((1,))
    assert rec(1, 2) != rec(1, 3)


def test_records_of_one_and_no_compared_field() -> None:
    one = record(type("One", (), {"__annotations__": {"x": "int"}}), frozen=True)
    none = record(type("Nil", (), {}), frozen=True)
    assert one(3) == one(3) and one(3) != one(4) and hash(one(3)) == hash((3,))
    assert none() == none() and hash(none()) == hash(()) and repr(none()) == "Nil()"


def test_ibal_types_records() -> None:
    a = MadAddr(remote_qp=1, remote_qkey=0x80010000, dlid=5)
    assert a == MadAddr(remote_qp=1, remote_qkey=0x80010000, dlid=5) and len({a, a}) == 1
    assert repr(a).startswith("MadAddr(remote_qp=1, remote_qkey=2147549184, dlid=5")
    p = PortAttr(1, 0x10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.lid = 3  # type: ignore[misc]


def test_port_lookups_take_the_first_entry_and_follow_new_attributes() -> None:
    g1, g2 = Gid("fe80::1"), Gid("::ffff:10.0.0.1")
    table = (GidEntry(0, g1), GidEntry(1, g2, GidType.ROCE_V1), GidEntry(2, g2, GidType.ROCE_V2))
    p = PortAttr(1, 0x10, pkeys=(0xFFFF, 0x8001, 0x0001), gid_table=table)
    assert (p.gid_index(g1.packed), p.gid_index(bytearray(g2.packed))) == (0, 1)
    assert p.gid_index(bytes(16)) is None
    assert (p.pkey_index(0x7FFF), p.pkey_index(0x0001), p.pkey_index(0x1234)) == (0, 1, None)
    ca = CaAttr(ca_guid=1, ports=(PortAttr(1, 0x10), p.__class__(2, 0x11, gid_table=table)))
    assert ca.port_of_gid(g2.packed).port_num == 2  # type: ignore[union-attr]
    assert ca.port_of_gid(Gid("fe80::9").packed) is None
    # a port change hands out new attributes: their lookups are their own
    q = PortAttr(1, 0x10, gid_table=(GidEntry(4, g2),))
    assert (q.gid_index(g2.packed), p.gid_index(g2.packed)) == (4, 1)


def test_derived_builds_once_per_object_and_never_mixes_objects() -> None:
    calls: list[object] = []

    def build(o: object) -> Any:
        calls.append(o)
        return len(calls)

    a, b = object(), object()
    assert derived(a, "n", lambda: build(a)) == derived(a, "n", lambda: build(a)) == 1
    assert derived(b, "n", lambda: build(b)) == 2
    assert derived(a, "m", lambda: build(a)) == 3  # another name, another value
    assert calls == [a, b, a]
    for _ in range(300):  # past the bound: the memo starts over, values stay right
        o = object()
        assert derived(o, "n", lambda o=o: o) is o  # type: ignore[misc]
    assert derived(a, "n", lambda: "rebuilt") == "rebuilt"
