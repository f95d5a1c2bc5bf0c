"""The target's sans-IO controller (ibal.ulp.nvme.controller): any capsule a peer sends
is answered with a completion for its command id, or dropped and counted; it never
raises and never moves more data than the command's descriptor names."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from ibal.ulp.nvme import wire as w
from ibal.ulp.nvme.controller import (
    MAX_IO,
    Deliver,
    Fetch,
    Hold,
    Namespace,
    QueueMachine,
    Respond,
    Subsystem,
)

NQN = "nqn.2026-12.org.ibal:unit"
HOST = "nqn.2014-08.org.nvmexpress:uuid:" + str(uuid.UUID(int=1))


def _connected(qid: int = 0) -> tuple[Subsystem, QueueMachine]:
    subsys = Subsystem(NQN, [Namespace(1, size=64 * 1024)])
    admin = QueueMachine(subsys, 0, 32)
    sgl = w.Sgl.keyed_addr(0x1000, 1024, 7)
    step = admin.capsule(w.connect_command(1, 0, 31, 0, sgl))
    assert isinstance(step, Fetch) and step.length == 1024
    done = step.then(w.connect_data(uuid.UUID(int=1), w.CNTLID_DYNAMIC, NQN, HOST))
    assert isinstance(done, Respond) and done.completion.ok
    admin.answered()
    if qid == 0:
        return subsys, admin
    ctrl = admin.ctrl
    assert ctrl is not None
    ctrl.cc = w.CC_EN
    io = QueueMachine(subsys, qid, 8, inline=4096)
    step = io.capsule(w.connect_command(1, qid, 7, 0, sgl))
    assert isinstance(step, Fetch)
    done = step.then(w.connect_data(uuid.UUID(int=1), ctrl.cntlid, NQN, HOST))
    assert isinstance(done, Respond) and done.completion.ok, done
    return subsys, io


def _settle(step: object, cid: int, fetched: bytes = b"") -> w.Completion | None:
    """Run a step to its completion the way the transport would."""
    while isinstance(step, Fetch):
        assert step.length <= MAX_IO and step.sgl.length == step.length
        step = step.then(fetched.ljust(step.length, b"\0")[: step.length])
    if step is None or isinstance(step, Hold):
        return None
    if isinstance(step, Deliver):
        assert len(step.data) == step.sgl.length <= MAX_IO
        return step.completion
    assert isinstance(step, Respond)
    return step.completion


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=200), st.sampled_from([0, 1]))
def test_any_capsule_is_answered_or_dropped(raw: bytes, qid: int) -> None:
    subsys, q = _connected(qid)
    before = sum(subsys.stats.values())
    c = _settle(q.capsule(raw), 0)
    if len(raw) < w.SQE_SIZE:
        assert c is None and subsys.stats["dropped: short capsule"] == 1
        return
    if c is not None:
        assert c.command_id == int.from_bytes(raw[2:4], "little") and c.sq_id == qid
    assert sum(subsys.stats.values()) >= before


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 0xFF), st.integers(0, (1 << 64) - 1), st.integers(0, 0xFFFF),
       st.integers(0, 0xFF), st.integers(0, (1 << 24) - 1))  # fmt: skip
def test_io_commands_stay_inside_their_descriptor(op: int, slba: int, nlb: int, sgl_type: int,
                                                  length: int) -> None:  # fmt: skip
    _, q = _connected(1)
    sgl = w.Sgl(sgl_type, 0x2000, length, 9) if sgl_type >> 4 == 4 else \
        w.Sgl(sgl_type, 0, length & 0xFFFF)  # fmt: skip
    cmd = w.SQE.encode(opcode=op, flags=w.PSDT_SGL, command_id=3, nsid=1, dptr=sgl.encode(),
                       cdw10=slba & 0xFFFFFFFF, cdw11=slba >> 32, cdw12=nlb)  # fmt: skip
    c = _settle(q.capsule(cmd), 3)
    assert c is not None and c.command_id == 3
    if c.ok and op in (w.IoOpcode.READ, w.IoOpcode.WRITE):
        assert slba + nlb + 1 <= 128 and (nlb + 1) * 512 == length  # inside the namespace


def test_read_past_the_end_is_lba_out_of_range() -> None:
    subsys, q = _connected(1)
    sgl = w.Sgl.keyed_addr(0x2000, 1024, 9)
    c = _settle(q.capsule(w.rw_command(w.IoOpcode.READ, 5, 1, 127, 2, sgl)), 5)
    assert c is not None and c.status == w.Sc.LBA_RANGE | w.DNR
    assert subsys.stats["bad: LBA range"] == 1
