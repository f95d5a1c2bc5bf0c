"""Protection domains, memory regions and windows of an rxe CA, and the key table.

:class:`KeyTable` maps L_Keys and R_Keys to :class:`Mr` and :class:`Mw`
objects.  A key is a 24-bit index and a random low byte (the "key" byte of
IBA 10.6.3.1, which rxe draws at random too), so a stale or guessed key
does not reach a newer region.  :class:`QpMemory` is the transport core's
:class:`~ibal.transport.qp.MemoryAccess` for one QP: every translation
checks the key, the protection domain, the access rights and the bounds, and
answers ``None`` when any of them fails.

Threading: called under the CA lock (verbs and the engine take it).
"""

from __future__ import annotations

import itertools
import secrets
from typing import Protocol

from ibal.providers.checks import LOCAL_WRITE, type2_bind_allowed
from ibal.types import FmrCreate

_EMPTY = memoryview(bytearray())


class Resource:
    """A handle: the CA that made it and whether it is still alive."""

    __slots__ = ("alive", "ca")

    def __init__(self, ca: object) -> None:
        self.ca = ca
        self.alive = True


class Pd(Resource):
    """A protection domain; ``users`` counts the objects that keep it busy; ``num``
    names it to the C engine's region table (unique in the process, never 0)."""

    __slots__ = ("num", "users")
    _nums = itertools.count(1)

    def __init__(self, ca: object) -> None:
        super().__init__(ca)
        self.users = 0
        self.num = next(Pd._nums)


class Mr(Resource):
    """A registered region: a view of the consumer's bytes at ``vaddr``."""

    __slots__ = ("access", "length", "lkey", "parent", "pd", "rkey", "shares", "vaddr", "view",
                 "windows")

    def __init__(self, ca: object, pd: Pd, view: memoryview, vaddr: int, access: int) -> None:
        super().__init__(ca)
        self.pd = pd
        self.view = view
        self.vaddr = vaddr
        self.length = len(view)
        self.access = access
        self.lkey = 0
        self.rkey = 0
        self.windows = 0
        self.shares = 0  # shared regions over this one's pages
        self.parent: Mr | None = None  # the region this one shares


class Fmr(Resource):
    """A fast memory region: its limits, and the current mapping (``None`` while unmapped)
    as a region in the key table."""

    __slots__ = ("create", "maps", "mr", "pages", "pd")

    def __init__(self, ca: object, pd: Pd, create: FmrCreate) -> None:
        super().__init__(ca)
        self.pd = pd
        self.create = create
        self.maps = 0  # maps since the last unmap
        self.mr: Mr | None = None
        self.pages: tuple[object, ...] = ()


class Mw(Resource):
    """A memory window: unbound, or a range of ``mr`` with remote rights.

    Type 1 windows are bound by ``bind_mw``; type 2 ones by a BIND_MW work
    request, only from the free state (``valid`` false), and answer only on
    the QP they were bound through (``qp``, IBA type 2B) until invalidated.
    """

    __slots__ = ("access", "addr", "length", "mr", "mw_type", "pd", "qp", "rkey", "valid")

    def __init__(self, ca: object, pd: Pd, mw_type: int = 1) -> None:
        super().__init__(ca)
        self.pd = pd
        self.rkey = 0
        self.mr: Mr | None = None
        self.addr = 0
        self.length = 0
        self.access = 0
        self.mw_type = mw_type
        self.valid = mw_type == 1
        self.qp: object = None

    def unbind(self) -> None:
        if self.mr is not None:
            self.mr.windows -= 1
            self.mr = None
        self.addr = self.length = self.access = 0
        self.valid = self.mw_type == 1
        self.qp = None


class KeyMirror(Protocol):
    """What a :class:`KeyTable` tells a copy of itself."""

    def installed(self, obj: Mr | Mw, key: int) -> None: ...

    def removed(self, key: int) -> None: ...


class KeyTable:
    """Keys to regions and windows, with the checks every access goes through."""

    def __init__(self) -> None:
        self._keys: dict[int, Mr | Mw] = {}
        self._indexes: set[int] = set()  # a wrapped index never reaches a live key
        self._next_index = 1
        self.mirror: KeyMirror | None = None
        """The C engine's copy of the regions' remote keys (``fastmr.MrMirror``),
        changed with every install and remove, under the CA lock as they are."""

    def __len__(self) -> int:
        return len(self._keys)

    def new_key(self) -> int:
        while True:
            index = self._next_index
            self._next_index = (index + 1) & 0xFFFFFF or 1
            key = (index << 8) | secrets.randbits(8)
            if key >> 8 not in self._indexes:
                return key

    @staticmethod
    def next_variant(key: int) -> int:
        """The same index with another key byte (a window's rebind, a re-registration)."""
        return (key & ~0xFF) | ((key + 1 + secrets.randbelow(255)) & 0xFF)

    def install(self, obj: Mr | Mw, key: int) -> None:
        self._keys[key] = obj
        self._indexes.add(key >> 8)
        if self.mirror is not None:
            self.mirror.installed(obj, key)

    def remove(self, key: int) -> None:
        if self._keys.pop(key, None) is not None:
            self._indexes.discard(key >> 8)
        if self.mirror is not None:
            self.mirror.removed(key)

    def get(self, key: int) -> Mr | Mw | None:
        return self._keys.get(key)


def _slice(mr: Mr, addr: int, length: int) -> memoryview | None:
    off = addr - mr.vaddr
    if off < 0 or length < 0 or off + length > mr.length:
        return None
    return mr.view[off : off + length]


class QpMemory:
    """The :class:`~ibal.transport.qp.MemoryAccess` of one QP (its PD's keys)."""

    __slots__ = ("keys", "owner", "pd")

    def __init__(self, keys: KeyTable, pd: Pd) -> None:
        self.keys = keys
        self.pd = pd
        self.owner: object = None  # the QP: type 2 windows answer only on theirs

    def _mr(self, lkey: int) -> Mr | None:
        mr = self.keys.get(lkey)
        if type(mr) is not Mr or mr.pd is not self.pd or mr.lkey != lkey:
            return None
        return mr

    def local(self, lkey: int, addr: int, length: int, write: bool) -> memoryview | None:
        if not length:
            return _EMPTY
        mr = self._mr(lkey)
        if mr is None or (write and not mr.access & LOCAL_WRITE):
            return None
        return _slice(mr, addr, length)

    def recv(self, lkey: int, addr: int, length: int) -> memoryview | None:
        return self.local(lkey, addr, length, True)

    def remote(self, rkey: int, va: int, length: int, access: int) -> memoryview | None:
        if not length:
            return _EMPTY
        obj = self.keys.get(rkey)
        if obj is None or obj.pd is not self.pd or obj.rkey != rkey:
            return None
        if type(obj) is Mw:
            mr = obj.mr
            if mr is None or obj.access & access != access:
                return None
            if obj.qp is not None and obj.qp is not self.owner:
                return None
            if va < obj.addr or va + length > obj.addr + obj.length:
                return None
            return _slice(mr, va, length)
        assert type(obj) is Mr
        if obj.access & access != access:
            return None
        return _slice(obj, va, length)

    def _type2(self, key: int) -> Mw | None:
        """The valid type 2 window of this PD whose R_Key is exactly ``key``.

        Only windows: the contract has no fast-register regions, and a region
        registered the ordinary way is not invalidated (IBA; kernel rxe too).
        """
        mw = self.keys.get(key)
        if type(mw) is not Mw or mw.mw_type != 2 or not mw.valid:
            return None
        if mw.rkey != key or mw.pd is not self.pd:
            return None
        return mw

    def invalidate(self, rkey: int) -> bool:
        mw = self._type2(rkey)
        if mw is None or mw.qp is not self.owner:
            return False
        mw.unbind()
        return True

    def local_invalidate(self, key: int) -> bool:
        """LOCAL_INV of ``key`` (a type 2 window of this PD); False if not allowed."""
        mw = self._type2(key)
        if mw is None:
            return False
        mw.unbind()
        return True

    def bind_type2(self, mw: Mw, mr: Mr | None, addr: int, length: int, acc: int,
                   new_rkey: int) -> bool:
        """A BIND_MW work request of the owner QP, with IBA 10.6.7.2's checks."""
        if not mw.alive or mw.mw_type != 2 or mw.valid or mw.pd is not self.pd:
            return False  # bound from the free state only
        if mr is None or not mr.alive or mr.pd is not self.pd:
            return False
        if not type2_bind_allowed(mw.rkey, new_rkey, mr.access, mr.vaddr, mr.length, addr,
                                  length, acc):
            return False
        self.keys.remove(mw.rkey)
        mw.rkey = new_rkey
        self.keys.install(mw, new_rkey)
        mw.mr = mr
        mr.windows += 1
        mw.addr = addr
        mw.length = length
        mw.access = acc
        mw.valid = True
        mw.qp = self.owner
        return True

