"""Deliberately broken variants of the mock provider, for the chapters the sample lacks.

The sample provider (``broken_sample.py``) keeps to memory regions and has no
MADs, so its mutants never reach the Invalidate and MAD chapters.  Teaching
the sample type 2 windows and special QPs would double the reference a vendor
reads; the mock implements both already, so these mutants patch the mock
instead, the same way (a few lines of monkeypatching, undone after each
check).  ``suite_broken_mock.py`` runs only those two chapters against them.

The MAD chapter's routing rules (requests by class and method, responses by
the TID's high half) belong to whoever runs the port's MAD layer: the kernel
behind a ``mad_agents`` provider, the access layer's ``SplQpTransport`` over a
provider with special QPs such as the mock.  Mutants of those rules patch that
transport; the rest patch the mock itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from broken_sample import Apply, Mutant

from ibal.al import mad_port
from ibal.providers.mock import invalidate
from ibal.providers.mock.engine import Engine
from ibal.providers.mock.objects import MockMr, MockMw
from ibal.types import QP1_WELL_KNOWN_QKEY, QpType, RecvOpt, WcStatus, WcType, mad_is_response

MOCK_MUTANTS: dict[str, Mutant] = {}


def mutant(chapter: str, rule: str) -> Callable[[Apply], Apply]:
    def register(fn: Apply) -> Apply:
        MOCK_MUTANTS[fn.__name__] = Mutant(fn.__name__, chapter, rule, fn)
        return fn

    return register


def _wrap(mp: pytest.MonkeyPatch, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    """Replace ``owner.name`` by ``make(original)``."""
    mp.setattr(owner, name, make(getattr(owner, name)))


def _edit_wcs(mp: pytest.MonkeyPatch, edit: Callable[[Any], Any]) -> None:
    """Pass every completion the mock queues through ``edit``."""

    def make(orig: Any) -> Any:
        def push_wc(self: Engine, cq: Any, wc: Any, solicited: bool = False) -> None:
            orig(self, cq, edit(wc), solicited)

        return push_wc

    _wrap(mp, Engine, "_push_wc", make)


def _key_of(ca: Any, key: int) -> MockMw | None:
    mw = ca.keys.get(key)
    return mw if isinstance(mw, MockMw) else None


# ------------------------------------------------------------------ invalidate


@mutant("Invalidate", "a SEND with invalidate kills the R_Key it names")
def send_inv_ignored(mp: pytest.MonkeyPatch) -> None:
    def remote_invalidate(ca: Any, qp: Any, key: int) -> bool:
        mw = _key_of(ca, key)
        return mw is not None and mw.valid and mw.rkey == key  # ...and leaves it valid

    mp.setattr(invalidate, "remote_invalidate", remote_invalidate)


@mutant("Invalidate", "the receive of a SEND with invalidate carries RecvOpt.INVALIDATE")
def inv_flag_missing(mp: pytest.MonkeyPatch) -> None:
    def edit(wc: Any) -> Any:
        if wc.recv_opt & RecvOpt.INVALIDATE:
            return dataclasses.replace(wc, recv_opt=wc.recv_opt & ~RecvOpt.INVALIDATE)
        return wc

    _edit_wcs(mp, edit)


@mutant("Invalidate", "the receive of a SEND with invalidate names the invalidated R_Key")
def inv_rkey_wrong(mp: pytest.MonkeyPatch) -> None:
    def edit(wc: Any) -> Any:
        if wc.recv_opt & RecvOpt.INVALIDATE:
            return dataclasses.replace(wc, invalidated_rkey=wc.invalidated_rkey ^ 1)
        return wc

    _edit_wcs(mp, edit)


@mutant("Invalidate", "LOCAL_INV kills the R_Key it names")
def local_inv_keeps_key(mp: pytest.MonkeyPatch) -> None:
    def local_invalidate(ca: Any, qp: Any, key: int) -> WcStatus:
        mw = _key_of(ca, key)
        ok = mw is not None and mw.valid and mw.rkey == key
        return WcStatus.SUCCESS if ok else WcStatus.LOCAL_OP_ERR

    mp.setattr(invalidate, "local_invalidate", local_invalidate)


@mutant("Invalidate", "an ordinary region's R_Key cannot be invalidated (locally or remotely)")
def mr_invalidation_allowed(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def inv(ca: Any, qp: Any, key: int) -> Any:
            if isinstance(ca.keys.get(key), MockMr):
                return WcStatus.SUCCESS if orig is original_local else True
            return orig(ca, qp, key)

        return inv

    original_local = invalidate.local_invalidate
    _wrap(mp, invalidate, "local_invalidate", make)
    _wrap(mp, invalidate, "remote_invalidate", make)


@mutant("Invalidate", "a type 2 window answers only its current R_Key (old keys die)")
def stale_window_keys_accepted(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def remote(ca: Any, qp: Any, rkey: int, *rest: Any) -> Any:
            if rkey not in ca.keys:  # match on the index, ignoring the key byte
                for key, obj in list(ca.keys.items()):
                    if isinstance(obj, MockMw) and key & ~0xFF == rkey & ~0xFF:
                        rkey = key
            return orig(ca, qp, rkey, *rest)

        return staticmethod(remote)

    _wrap(mp, Engine, "_remote", make)


@mutant("Invalidate", "a type 2 bind gives the window the R_Key the BIND_MW names")
def bind_keeps_old_key(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def bind(ca: Any, qp: Any, mw: MockMw, *rest: Any) -> WcStatus:
            old = mw.rkey
            status: WcStatus = orig(ca, qp, mw, *rest)
            if status is WcStatus.SUCCESS:
                del ca.keys[mw.rkey]
                mw.rkey = old
                ca.keys[old] = mw
            return status

        return bind

    _wrap(mp, invalidate, "bind_type2", make)


@mutant("Invalidate", "a type 2 window exposes only the range it was bound to")
def bind_ignores_range(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def bind(ca: Any, qp: Any, mw: Any, mr: Any, addr: int, length: int, *rest: Any) -> Any:
            if mr is not None and addr >= mr.vaddr and addr + length <= mr.vaddr + mr.length:
                addr, length = mr.vaddr, mr.length
            return orig(ca, qp, mw, mr, addr, length, *rest)

        return bind

    _wrap(mp, invalidate, "bind_type2", make)


@mutant("Invalidate", "a type 2 bind may change only the R_Key's key byte")
def bind_changes_index(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def bind(ca: Any, qp: Any, mw: MockMw, mr: Any, addr: int, length: int, acc: int,
                 new_rkey: int) -> Any:  # fmt: skip
            if (new_rkey ^ mw.rkey) & ~0xFF and mw.rkey in ca.keys and new_rkey not in ca.keys:
                # Move the window to the index asked for, so the check below passes.
                del ca.keys[mw.rkey]
                mw.rkey = (new_rkey & ~0xFF) | ((new_rkey - 1) & 0xFF)
                ca.keys[mw.rkey] = mw
            return orig(ca, qp, mw, mr, addr, length, acc, new_rkey)

        return bind

    _wrap(mp, invalidate, "bind_type2", make)


# ------------------------------------------------------------------------ MADs


@mutant("MADs", "QP1 drops a MAD whose Q_Key is not 0x80010000 (and counts it)")
def qp1_qkey_unchecked(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def ud_rx(self: Engine, qp: Any, pkt: Any) -> None:
            if qp.qp_type is QpType.QP1:
                pkt.qkey = QP1_WELL_KNOWN_QKEY
            orig(self, qp, pkt)

        return ud_rx

    _wrap(mp, Engine, "_ud_rx", make)


@mutant("MADs", "a QP1 receive names the sending QP (src_qp), so a response finds it")
def qp1_recv_without_src_qp(mp: pytest.MonkeyPatch) -> None:
    def edit(wc: Any) -> Any:
        if wc.wc_type is WcType.RECV and wc.qp_num == 1:
            return dataclasses.replace(wc, src_qp=0)
        return wc

    _edit_wcs(mp, edit)


@mutant("MADs", "a request reaches the agent serving its class and method")
def mad_to_wrong_agent(mp: pytest.MonkeyPatch) -> None:
    class ByMethodOnly(dict[tuple[int, int, int], Any]):
        def get(self, key: Any, default: Any = None) -> Any:
            return next((v for k, v in self.items() if k[2] == key[2]), default)

    def make(orig: Any) -> Any:
        def init(self: Any, *args: Any) -> None:
            orig(self, *args)
            self._methods = ByMethodOnly()

        return init

    _wrap(mp, mad_port.SplQpTransport, "__init__", make)


@mutant("MADs", "a response reaches its asker by the TID's high half")
def tid_high_half_not_stamped(mp: pytest.MonkeyPatch) -> None:
    def make(orig: Any) -> Any:
        def post(self: Any, out: Any) -> None:
            if not mad_is_response(out.mad):
                out.mad = out.mad[:8] + bytes(4) + out.mad[12:]
            orig(self, out)

        return post

    _wrap(mp, mad_port.SplQpTransport, "_post", make)


@mutant("MADs", "the asker's send completes before the response reaches it")
def response_before_send_done(mp: pytest.MonkeyPatch) -> None:
    held: list[tuple[Any, WcStatus]] = []
    routing: list[bool] = []
    report = mad_port.SplQpTransport._report

    def late_report(self: Any, out: Any, status: WcStatus) -> None:
        if routing and status is WcStatus.SUCCESS:
            held.append((out, status))  # ended by the answer: report it after the answer
            return
        report(self, out, status)

    def make(orig: Any) -> Any:
        def route(self: Any, recv: Any) -> None:
            routing.append(True)
            try:
                orig(self, recv)
            finally:
                routing.pop()
            while held:
                report(self, *held.pop())

        return route

    mp.setattr(mad_port.SplQpTransport, "_report", late_report)
    _wrap(mp, mad_port.SplQpTransport, "_route", make)


__all__ = ["MOCK_MUTANTS"]
