"""PSNs and key bytes from the OS's randomness, not from ``random`` (issue 25 §2)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

import ibal
from ibal.al import AccessLayer, QpCreate
from ibal.types import AccessFlags, QpState, QpType


@pytest.fixture
def al() -> Iterator[AccessLayer]:
    al = ibal.open_al(providers={"mock": {"cas": 1}})
    yield al
    al.close()


def _qp(al: AccessLayer) -> ibal.al.Qp:
    ca = al.open_ca(al.get_ca_guids()[0])
    cq = ca.create_cq(16)
    return ca.alloc_pd().create_qp(QpCreate(QpType.RC, cq, cq))


def test_start_psns_do_not_repeat_after_random_seed(al: AccessLayer) -> None:
    qp = _qp(al)
    runs = []
    for _ in range(2):
        random.seed(25)
        runs.append([ibal.endpoint(qp, 1).psn for _ in range(32)])
    assert runs[0] != runs[1]
    assert all(0 <= p < 1 << 24 for p in runs[0] + runs[1])


def test_connect_qp_with_a_port_number_draws_its_psn(al: AccessLayer) -> None:
    psns = []
    for _ in range(6):
        qp, peer = _qp(al), _qp(al)
        ibal.connect_qp(qp, 1, ibal.endpoint(peer, 1))
        assert qp.state is QpState.RTS
        psns.append(qp.query().sq_psn)
    assert len(set(psns)) > 1 and psns != [0] * 6  # was 0 every time


def test_mock_key_bytes_are_not_the_index_times_a_constant(al: AccessLayer) -> None:
    pd = al.open_ca(al.get_ca_guids()[0]).alloc_pd()
    keys = [pd.reg_mem(bytearray(64), AccessFlags.LOCAL_WRITE).lkey for _ in range(24)]
    # the old rule: key byte = index * 0x3B; 24 random bytes all matching it: 2**-192
    assert any(k & 0xFF != ((k >> 8) * 0x3B) & 0xFF for k in keys)
    assert len({k >> 8 for k in keys}) == 24
