"""The C engine's region table kept in step with the key table (``fastmr.MrMirror``).

A hypothesis state machine registers, re-registers (a new key variant, another
range, access or PD), deregisters regions and binds and invalidates windows
through a :class:`KeyTable` whose mirror is the C table, and after every step
asks C and ``QpMemory.remote`` the same questions: C may only accept what the
Python core accepts, into the same bytes, and refuse what it refuses; a miss
is allowed only for what C never holds (windows, keys without remote rights,
read-only buffers).
"""

from __future__ import annotations

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from test_rxe_fastpath import need_c

from ibal.providers.rxe.fastmr import MrMirror
from ibal.providers.rxe.memory import KeyTable, Mr, Mw, Pd, QpMemory
from ibal.types import AccessFlags

_REMOTE = [int(AccessFlags.RDMA_WRITE), int(AccessFlags.RDMA_READ), int(AccessFlags.ATOMIC)]


class MirrorTwin(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ffi, self.lib = need_c()
        self.mirror = MrMirror(self.ffi, self.lib, capacity=256)
        self.keys = KeyTable()
        self.keys.mirror = self.mirror
        self.pds = [Pd(None), Pd(None)]
        self.mrs: list[Mr] = []
        self.mws: list[Mw] = []
        self.bufs: list[bytearray] = []

    def _install(self, mr: Mr, remote: bool, key: int | None = None) -> None:
        key = self.keys.new_key() if key is None else key
        mr.lkey = key
        mr.rkey = key if remote else 0
        self.keys.install(mr, key)

    @rule(pd=st.integers(0, 1), length=st.integers(1, 3000), vaddr=st.integers(0, 2**64 - 1),
          access=st.integers(0, 31), remote=st.booleans(), readonly=st.booleans())  # fmt: skip
    def register(self, pd: int, length: int, vaddr: int, access: int, remote: bool,
                 readonly: bool) -> None:  # fmt: skip
        if len(self.mrs) >= 30:
            return
        vaddr %= 2**64 - length
        buf = bytearray(length)
        self.bufs.append(buf)
        view = memoryview(bytes(buf)) if readonly else memoryview(buf)
        mr = Mr(None, self.pds[pd], view, vaddr, access)
        self._install(mr, remote)
        self.mrs.append(mr)

    @rule(i=st.integers(0, 29), pd=st.integers(0, 1), access=st.integers(0, 31),
          new_range=st.booleans())  # fmt: skip
    def reregister(self, i: int, pd: int, access: int, new_range: bool) -> None:
        if not self.mrs:
            return
        mr = self.mrs[i % len(self.mrs)]
        self.keys.remove(mr.lkey)  # as MemoryVerbs.modify_mr
        mr.pd = self.pds[pd]
        mr.access = access
        if new_range:
            buf = bytearray(mr.length + 64)
            self.bufs.append(buf)
            mr.view = memoryview(buf)
            mr.length = len(buf)
            mr.vaddr = (mr.vaddr + 4096) % 2**63
        self._install(mr, bool(access & 0x0E), self.keys.next_variant(mr.lkey))

    @rule(i=st.integers(0, 29))
    def deregister(self, i: int) -> None:
        if not self.mrs:
            return
        mr = self.mrs.pop(i % len(self.mrs))
        self.keys.remove(mr.lkey)
        # the pin went with the entry: the consumer's buffer is free again
        if not mr.view.readonly:
            mr.view.release()

    @rule(i=st.integers(0, 29), access=st.sampled_from(_REMOTE))
    def bind_window(self, i: int, access: int) -> None:
        live = [m for m in self.mrs if not m.view.readonly]
        if not live:
            return
        mr = live[i % len(live)]
        mw = Mw(None, mr.pd)
        mw.rkey = self.keys.new_key()
        mw.mr, mw.addr, mw.length, mw.access = mr, mr.vaddr, mr.length, access
        self.keys.install(mw, mw.rkey)
        self.mws.append(mw)

    @rule(i=st.integers(0, 29))
    def invalidate_window(self, i: int) -> None:
        if not self.mws:
            return
        mw = self.mws.pop(i % len(self.mws))
        self.keys.remove(mw.rkey)
        mw.unbind()

    @rule(pick=st.integers(0, 60), pd=st.integers(0, 1), off=st.integers(-8, 3100),
          length=st.integers(1, 3100), access=st.sampled_from(_REMOTE),
          junk=st.integers(0, 2**32 - 1))  # fmt: skip
    def look_up(self, pick: int, pd: int, off: int, length: int, access: int, junk: int) -> None:
        objs: list[Mr | Mw] = [*self.mrs, *self.mws]
        obj = objs[pick % len(objs)] if objs and pick < 50 else None
        rkey = (obj.rkey or obj.lkey) if isinstance(obj, Mr) else obj.rkey if obj else junk
        base = obj.vaddr if isinstance(obj, Mr) else 0
        va = (base + off) % 2**64
        out = self.ffi.new("uint8_t **")
        got = self.lib.rxe_mr_remote(self.mirror.table, rkey, self.pds[pd].num, va, length,
                                     access, out)  # fmt: skip
        py = QpMemory(self.keys, self.pds[pd]).remote(rkey, va, length, access)
        event(f"C answered {got}")
        if got == 1:
            assert py is not None and len(py) == length
            assert int(self.ffi.cast("uintptr_t", out[0])) == int(
                self.ffi.cast("uintptr_t", self.ffi.from_buffer(py)))  # fmt: skip
        elif got == 0:
            assert py is None
        else:
            assert got == -1
            held = self.keys.get(rkey)
            assert held is None or type(held) is Mw or held.rkey != rkey or held.view.readonly

    @invariant()
    def same_regions(self) -> None:
        if hasattr(self, "mirror"):
            remote = [m for m in self.mrs if m.rkey and not m.view.readonly]
            assert len(self.mirror) == len(remote)


MirrorTwin.TestCase.settings = settings(max_examples=60, stateful_step_count=50, deadline=None)
TestMirrorTwin = MirrorTwin.TestCase


def test_a_deregistered_region_lets_go_of_the_buffer() -> None:
    ffi, lib = need_c()
    keys = KeyTable()
    keys.mirror = mirror = MrMirror(ffi, lib, capacity=16)
    buf = bytearray(100)
    mr = Mr(None, Pd(None), memoryview(buf), 0x1000, int(AccessFlags.RDMA_WRITE))
    mr.lkey = mr.rkey = keys.new_key()
    keys.install(mr, mr.lkey)
    assert len(mirror) == 1
    keys.remove(mr.lkey)
    assert len(mirror) == 0
    mr.view.release()
    buf.extend(b"x")  # no export left: C's pin went with its entry


