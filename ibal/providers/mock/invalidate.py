"""Type 2 memory windows: bind and invalidate as the send queue and the responder do them.

Called by the engine under the fabric lock.  Only type 2 windows are
invalidated: the contract has no fast-register regions, and IBA (like kernel
rxe) does not let a region registered the ordinary way be invalidated.
"""

from __future__ import annotations

from ibal.providers.checks import type2_bind_allowed
from ibal.providers.mock.ca_state import CaState
from ibal.providers.mock.objects import MockMr, MockMw, MockQp
from ibal.types import AccessFlags, WcStatus

_OK = WcStatus.SUCCESS


def _window(ca: CaState, qp: MockQp, key: int) -> MockMw | None:
    """The valid type 2 window of ``qp``'s PD whose R_Key is exactly ``key``."""
    mw = ca.keys.get(key)
    if not isinstance(mw, MockMw) or not mw.alive:
        return None
    if mw.mw_type != 2 or mw.rkey != key or not mw.valid or mw.pd is not qp.pd:
        return None
    return mw


def _drop_binding(mw: MockMw) -> None:
    if mw.mr is not None:
        mw.mr.windows -= 1
        mw.mr = None
    mw.addr = mw.length = 0
    mw.access = AccessFlags.NONE
    mw.acc = 0
    mw.valid = False
    mw.qp = None


def local_invalidate(ca: CaState, qp: MockQp, key: int) -> WcStatus:
    """``LOCAL_INV``: the window stops answering ``key``; ``LOCAL_OP_ERR`` (as rxe) if it cannot."""
    mw = _window(ca, qp, key)
    if mw is None:
        return WcStatus.LOCAL_OP_ERR
    _drop_binding(mw)
    return _OK


def remote_invalidate(ca: CaState, qp: MockQp, key: int) -> bool:
    """A peer's SEND with invalidate, arriving on ``qp`` (the window's QP: type 2B)."""
    mw = _window(ca, qp, key)
    if mw is None or mw.qp is not qp:
        return False
    _drop_binding(mw)
    return True


def bind_type2(
    ca: CaState,
    qp: MockQp,
    mw: MockMw,
    mr: MockMr | None,
    addr: int,
    length: int,
    acc: int,
    new_rkey: int,
) -> WcStatus:
    """``BIND_MW``: IBA 10.6.7.2's checks, then the window answers ``new_rkey`` on ``qp``."""
    bad = WcStatus.MEM_WINDOW_BIND_ERR
    if not mw.alive or mw.mw_type != 2 or mw.valid or mw.pd is not qp.pd:
        return bad  # a type 2 window is bound from the free state only
    if mr is None or not mr.alive or mr.pd is not qp.pd:
        return bad
    if not type2_bind_allowed(mw.rkey, new_rkey, mr.acc, mr.vaddr, mr.length, addr, length, acc):
        return bad
    del ca.keys[mw.rkey]
    mw.rkey = new_rkey
    ca.keys[new_rkey] = mw
    mw.mr = mr
    mr.windows += 1
    mw.addr = addr
    mw.length = length
    mw.access = AccessFlags(acc)
    mw.acc = acc
    mw.valid = True
    mw.qp = qp
    return _OK
