"""A bounded random run over the receive paths of the MAD layer, CM, SA and DM (issue 25 §3).

On the mock fabric, a hand-driven port (B) sends MADs of the CM, DM and SA
classes (and others) to a port (A) that runs the CM agent, the DM agent and an
SA client waiting for answers and Reports: well-formed messages with random
fields, the same with flipped bits, and random bytes behind valid headers.  The
receivers may answer, drop and count, or reject; no exception may escape into
the log, no callback may fail, no thread may die, and A must still answer
afterwards.  The seed is fixed; the figures are in docs/testing.md.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
from collections.abc import Iterator

import pytest
from cm_world_mad import MadFuzzWorld, mad_fuzz_world

CASES = 1500


@pytest.fixture
def world() -> Iterator[MadFuzzWorld]:
    yield from mad_fuzz_world()


def test_random_mads_are_answered_or_dropped(
    world: MadFuzzWorld, caplog: pytest.LogCaptureFixture
) -> None:
    from ibal.status import IbError
    from ibal.wire.mad import header
    from ibal.wire.mad.cm import CmAttr
    from ibal.wire.mad.consts import Method, MgmtClass

    w = world
    rng = random.Random(25)
    caplog.set_level(logging.WARNING, logger="ibal")
    before = {t.name for t in threading.enumerate()}
    sent: collections.Counter[str] = collections.Counter()
    classes = [MgmtClass.COMM_MGT, MgmtClass.DEV_MGT, MgmtClass.SUBN_ADM]
    for i in range(CASES):
        cls = classes[i % 3]
        method = rng.choice([Method.GET, Method.SET, Method.SEND, Method.GET_RESP,
                             Method.REPORT, Method.GET_TABLE, rng.getrandbits(8)])  # fmt: skip
        if cls is MgmtClass.COMM_MGT:
            attr = rng.choice([*list(CmAttr), rng.getrandbits(16)])
            method = Method.SEND if rng.random() < 0.8 else method
        else:
            attr = rng.choice([0x0010, 0x0011, 0x0012, 0x0013, 0x0014, 0x0002, 0x0020,
                               rng.getrandbits(16)])  # fmt: skip
        mad = bytearray(header.build(cls, method, attr, tid=rng.getrandbits(64),
                                     attr_mod=rng.choice([0, rng.getrandbits(32)])))  # fmt: skip
        mad[24:] = rng.randbytes(len(mad) - 24)  # class header and data: anything
        for _ in range(rng.choice([0, 0, 1, 2])):
            # the header too, now and then (not the class: B's service would refuse it)
            mad[rng.choice([0, *range(2, 24)])] ^= 1 << rng.randrange(8)
        try:
            w.send(cls, bytes(mad))
        except IbError:
            sent["refused by B's own MAD service"] += 1
            continue
        sent[f"{MgmtClass(cls).name}"] += 1
        if i % 50 == 0:
            w.settle()
    w.settle()
    errors = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert errors == [], errors[:3]
    assert w.mgr.pnp_callback_errors == 0
    assert before <= {t.name for t in threading.enumerate()}
    assert w.still_answers()
    print(f"\nmad rx fuzz: {CASES} MADs; {dict(sent)}; A's CM stats {dict(w.cm_stats())}")
