"""CM communication IDs and starting PSNs an observer cannot predict (issue 25 §2).

Comm IDs came from a Mersenne Twister: 624 of them, untempered, are its whole
state, and the next ones follow exactly.  The test does that to the REQs A sends
to a hand-driven CM on B: the prediction must fail.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from cm_world import CmWorld, RawCm, cm_world, path

from ibal.cm import api
from ibal.cm.records import CmReq
from ibal.wire.mad.cm import CmAttr

MT_N = 624


def _untemper(y: int) -> int:
    """The MT19937 state word behind one 32-bit output (the tempering inverted)."""
    y ^= y >> 18
    y ^= (y << 15) & 0xEFC60000
    x = y
    for _ in range(5):
        x = y ^ ((x << 7) & 0x9D2C5680)
    y = x
    x = y
    for _ in range(3):
        x = y ^ (x >> 11)
    return x & 0xFFFFFFFF


def _predictor(outputs: list[int]) -> random.Random:
    rng = random.Random()
    rng.setstate((3, (*(_untemper(v) for v in outputs[-MT_N:]), MT_N), None))
    return rng


def test_the_untempering_predicts_a_twister() -> None:
    """The attack works (on ``random`` itself), so its failure below means something."""
    src = random.Random(1234)
    seen = [src.getrandbits(32) for _ in range(MT_N)]
    guess = _predictor(seen)
    assert [guess.getrandbits(32) for _ in range(10)] == [src.getrandbits(32) for _ in range(10)]


@pytest.fixture
def world() -> Iterator[CmWorld]:
    yield from cm_world()


def test_comm_ids_and_psns_of_624_reqs_do_not_predict_the_next(world: CmWorld) -> None:
    raw = RawCm(world.b)
    route = dict(path(world.a, world.b).fields)
    ids: list[int] = []
    psns: list[int] = []
    for _ in range(MT_N + 10):
        api.cm_req(CmReq(svc_id=0x77, qp=world.a.qp(), primary_path=route, resp_res=1,
                         init_depth=1, rep_cb=lambda rec: None))  # fmt: skip
        msg, _ = raw.next(world)
        assert msg.attr is CmAttr.REQ
        ids.append(msg.fields["local_comm_id"])
        psns.append(msg.fields["starting_psn"])
    guess = _predictor(ids[:MT_N])
    assert [guess.getrandbits(32) for _ in range(10)] != ids[MT_N:]
    assert len(set(ids)) == len(ids)
    assert len(set(psns)) > len(psns) // 2  # 24-bit draws: a few repeats at most
