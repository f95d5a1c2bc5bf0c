"""The probe's cases of issue 25 §2, one by one: each is the matching ibal status.

They raised TypeError, AttributeError, ValueError or AddressValueError from
inside the library, or were taken silently.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from typing import Any

import pytest
from robust_world import World, need_root

import ibal
import ibal.cm
from ibal.status import IbError, InvalidParameter, InvalidPort
from ibal.testing.helpers import make_pair
from ibal.types import AccessFlags, QpType


def _released() -> memoryview:
    mv = memoryview(bytearray(4096))
    mv.release()
    return mv


def _closed_mmap() -> mmap.mmap:
    mm = mmap.mmap(-1, 4096)
    mm.close()
    return mm


def _dereg_then_sge(w: World) -> object:
    mr = w.ca0.alloc_pd().reg_mem(bytearray(64), AccessFlags.LOCAL_WRITE)
    mr.dereg()
    return mr.sge(0, 4)


def _cm_unknown_keyword(w: World) -> object:
    p = make_pair(w.ca0, w.p0, w.ca1, w.p1, QpType.RC, do_connect=False)
    return ibal.cm.connect(w.al, p.a.qp, None, 0x1234, callback=lambda c: None, colour="red")


CASES: dict[str, tuple[Callable[[World], Any], type[IbError]]] = {
    "reg_mem(released memoryview)": (
        lambda w: w.ca0.alloc_pd().reg_mem(_released(), AccessFlags.LOCAL_WRITE), InvalidParameter),
    "reg_mem(closed mmap)": (
        lambda w: w.ca0.alloc_pd().reg_mem(_closed_mmap(), AccessFlags.LOCAL_WRITE),
        InvalidParameter),
    "mr.sge('0', 4)": (
        lambda w: w.ca0.alloc_pd().reg_mem(bytearray(64), AccessFlags.LOCAL_WRITE).sge("0", 4),
        InvalidParameter),
    "mr.sge after dereg": (_dereg_then_sge, ibal.status.InvalidMrHandle),
    "drain(timeout='x')": (
        lambda w: make_pair(w.ca0, w.p0, w.ca1, w.p1, QpType.RC).a.qp.drain(timeout="x"),
        InvalidParameter),
    "endpoint('notaqp', 1)": (lambda w: ibal.endpoint("notaqp", 1), InvalidParameter),
    "cm.connect(colour='red')": (_cm_unknown_keyword, InvalidParameter),
    "call_later(-1)": (lambda w: w.al.timers.call_later(-1, lambda: None), InvalidParameter),
    "local_mad(released view)": (lambda w: w.ca0.local_mad(w.p0.port_num, _released()),
                                 InvalidParameter),
    "query_port('1')": (lambda w: w.ca0.query_port("1"), InvalidPort),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_probe_case_is_an_ibal_status(world: World, case: str) -> None:
    call, status = CASES[case]
    with pytest.raises(status):
        call(world)


def test_open_al_with_an_address_no_interface_has_raises() -> None:
    need_root()
    with pytest.raises(InvalidParameter, match="no local interface has the address"):
        ibal.open_al(providers={"rxe": {"devices": "rxe_nowhere=999.1.2.3"}})
    with pytest.raises(InvalidParameter, match="options are a dict"):
        ibal.open_al(providers={"mock": 3})
