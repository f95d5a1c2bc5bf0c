"""ibal.wire.mad.tid.Pending as its three users drive it: keyed by the TID low half
(the AL's special-QP transport, the MAD service) and ended by whoever comes first."""

from __future__ import annotations

import pytest
from mad_world import GET_RESP, VENDOR, mad

from ibal.status import InvalidParameter
from ibal.wire.mad.tid import Pending


def test_low_half_keys_fresh_tids_skip_outstanding_and_zero() -> None:
    p: Pending[str] = Pending(VENDOR, tid_bits=32)
    assert p.add("a", 1) == 1 and p.add("b", 2) == 2
    assert p.fresh_tid() == 3  # 1 and 2 are outstanding
    with pytest.raises(InvalidParameter, match="TID low 0x00000002 is outstanding"):
        p.add("c", 2)
    q: Pending[str] = Pending(VENDOR, tid_bits=32, first_tid=0xFFFF_FFFF)
    assert q.fresh_tid() == 0xFFFF_FFFF and q.fresh_tid() == 1  # wraps past 0


def test_waiting_end_and_answer_end_a_send_once() -> None:
    p: Pending[str] = Pending(VENDOR, tid_bits=32)
    k = p.add("req", 0x42, retries=1)
    s = p.add("resp", None)
    assert p.waiting(k) == "req" and p.waiting(s) is None  # a serial awaits nothing
    assert p.end(k, "other") is None and p.get(k) == "req"  # another send's end: no effect
    assert p.answer(k, bytes(mad(VENDOR, GET_RESP, 0x42))) == "req"
    assert p.end(k, "req") is None and p.waiting(k) is None and not p.retry(k)
    assert p.items() == [(s, "resp")] and p.drain() == [(s, "resp")] and len(p) == 0
