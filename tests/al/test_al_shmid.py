"""``ib_reg_shmid``: registrations of one POSIX shared-memory segment, by two AL
instances and by two processes, reach the same pages."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory
from pathlib import Path

import pytest

import ibal
from ibal.al import AlManager
from ibal.status import InvalidMrHandle, InvalidParameter, InvalidSetting
from ibal.testing.helpers import active_port, make_pair, wait_wc
from ibal.types import AccessFlags, QpType, WcStatus

REMOTE = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ
SIZE = 3 * 4096
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def segment() -> Iterator[shared_memory.SharedMemory]:
    seg = shared_memory.SharedMemory(name=f"ibal-{uuid.uuid4().hex[:16]}", create=True, size=SIZE)
    try:
        yield seg
    finally:
        seg.close()
        seg.unlink()


@pytest.fixture
def mgr() -> Iterator[AlManager]:
    m = AlManager()
    m.start_provider("mock", {"cas": 1})
    yield m
    m.close(timeout=10)


def test_two_al_instances_share_the_pages(mgr: AlManager,
                                          segment: shared_memory.SharedMemory) -> None:  # fmt: skip
    first, second = mgr.open_al(), mgr.open_al()
    ca1 = first.open_ca(first.get_ca_guids()[0])
    port = active_port(ca1.query().ports)
    assert port is not None
    pair = make_pair(ca1, port, ca1, port, QpType.RC)
    mr1 = pair.b.pd.reg_shmid(segment.name, REMOTE)
    ca2 = second.open_ca(second.get_ca_guids()[0])
    mr2 = ca2.alloc_pd().reg_shmid(segment.name.encode().ljust(64, b"\0"), REMOTE, SIZE)
    assert mr1.length == mr2.length == SIZE
    assert mr1.vaddr != mr2.vaddr  # two mappings of one segment
    assert mr1.buffer is not None and mr2.buffer is not None
    pair.write(b"through the first", remote_addr=mr1.vaddr + 5000, rkey=mr1.rkey)
    assert wait_wc(pair.a.cq).status is WcStatus.SUCCESS
    assert bytes(mr2.buffer[5000:5017]) == b"through the first"
    assert bytes(segment.buf[5000:5017]) == b"through the first"
    # the other way round: memory the second instance registered, seen by the first
    mr2.buffer[0:6] = b"second"
    assert bytes(mr1.buffer[0:6]) == b"second"
    mr1.dereg()
    mr2.dereg()
    with pytest.raises(InvalidMrHandle):
        mr1.query()
    segment.buf[0:3] = b"abc"  # the segment outlives its registrations (the creator owns it)


CHILD = textwrap.dedent(
    """
    import sys
    import ibal
    from ibal.testing.helpers import active_port, make_pair, wait_wc
    from ibal.types import AccessFlags, QpType, WcStatus

    name = sys.argv[1]
    access = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE
    with ibal.open_al(providers={"mock": {"cas": 1}}) as al:
        ca = al.open_ca(al.get_ca_guids()[0])
        port = active_port(ca.query().ports)
        pair = make_pair(ca, port, ca, port, QpType.RC)
        mr = pair.b.pd.reg_shmid(name, access)
        pair.write(b"from the child", remote_addr=mr.vaddr + 100, rkey=mr.rkey)
        assert wait_wc(pair.a.cq).status is WcStatus.SUCCESS
        mr.dereg()
    print("written")
    """
)


def test_a_write_in_another_process_lands_in_this_registration(
    mgr: AlManager, segment: shared_memory.SharedMemory
) -> None:
    al = mgr.open_al()
    mr = al.open_ca(al.get_ca_guids()[0]).alloc_pd().reg_shmid(segment.name, REMOTE)
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", CHILD, segment.name], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "written"
    assert mr.buffer is not None and bytes(mr.buffer[100:114]) == b"from the child"


def test_refusals(mgr: AlManager, segment: shared_memory.SharedMemory) -> None:
    al = mgr.open_al()
    pd = al.open_ca(al.get_ca_guids()[0]).alloc_pd()
    with pytest.raises(InvalidSetting):
        pd.reg_shmid(segment.name, REMOTE, length=SIZE - 4096)  # not the region's length
    with pytest.raises(InvalidParameter):
        pd.reg_shmid(f"ibal-missing-{uuid.uuid4().hex[:8]}", REMOTE)
    for bad in ("", "a/b", "x" * 65, b"\xff\xfe", 42):
        with pytest.raises(InvalidParameter):
            pd.reg_shmid(bad, REMOTE)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter):
        pd.reg_shmid(segment.name, AccessFlags(0x1000))
    # a refused registration leaves nothing mapped: the segment can still be resized away
    mr = pd.reg_shmid(segment.name, REMOTE)
    mr.dereg()


def test_compat_spelling(segment: shared_memory.SharedMemory) -> None:
    from ibal import compat

    with ibal.open_al(providers={"mock": {"cas": 1}}) as al:
        ca = compat.ib_open_ca(al, al.get_ca_guids()[0])
        pd = compat.ib_alloc_pd(ca)
        mr = compat.ib_reg_shmid(pd, segment.name.encode(), REMOTE)
        assert mr.length == SIZE
        compat.ib_dereg_mr(mr)
