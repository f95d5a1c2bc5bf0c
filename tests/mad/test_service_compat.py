"""The IBAL spellings of the MAD pool and service calls."""

from __future__ import annotations

import pytest
from mad_world import GET, GET_RESP, VENDOR, Net, mad

from ibal import compat
from ibal.mad import MadElement, MadSvc
from ibal.status import InvalidHandle, InvalidParameter, InvalidPdHandle, InvalidSetting
from ibal.testing.helpers import wait_until
from ibal.types import WcStatus


def test_a_request_and_answer_in_ib_spelling(mock_net: Net) -> None:
    net = mock_net
    h_al = net.mgr.open_al()
    with pytest.raises(InvalidSetting):
        compat.ib_create_mad_pool(h_al, 4, 2, 1)
    h_pool = compat.ib_create_mad_pool(h_al, 2, 8, 2)
    key_a = compat.ib_reg_mad_pool(h_pool, net.a.pd)
    key_b = compat.ib_reg_mad_pool(h_pool, net.b.pd)
    heard: list[MadElement] = []
    done: list[MadElement] = []

    def serve(e: MadElement) -> None:
        e.mad[3] = GET_RESP
        compat.ib_send_mad(h_server, [e])

    h_server = compat.ib_reg_mad_svc(
        net.b.alias, MadSvc(VENDOR, 1, serve, methods=frozenset({GET}), support_unsol=True),
        key_b)
    h_asker = compat.ib_reg_mad_svc(net.a.alias, MadSvc(VENDOR, 1, heard.append, done.append),
                                    key_a)
    e = compat.ib_get_mad(key_a, 256)
    compat.ib_get_mad_buf(e)[:] = mad(VENDOR, GET, payload=b"hi")
    e.addr, e.resp_expected, e.timeout_ms = net.b.addr(), True, 100
    compat.ib_send_mad(h_asker, e)
    wait_until(lambda: len(heard) == 1, "the answer")
    assert done == [e] and e.status is WcStatus.SUCCESS
    assert len(heard) == 1 and heard[0].request is e and heard[0].mad[3] == GET_RESP
    with pytest.raises(InvalidHandle):
        compat.ib_send_mad(h_pool, e)  # type: ignore[arg-type]
    with pytest.raises(InvalidHandle):
        compat.ib_destroy_mad_pool(key_a)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter):
        compat.ib_dereg_mad_pool(h_pool)  # type: ignore[arg-type]
    with pytest.raises(InvalidPdHandle):
        compat.ib_reg_mad_pool(h_pool, net.a.ca)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter):
        compat.ib_reg_mad_svc(net.a.pd, MadSvc(VENDOR, 1, heard.append))  # type: ignore[arg-type]
    compat.ib_put_mad([*heard, e])
    assert key_a.outstanding == 0
