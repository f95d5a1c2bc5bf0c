"""Fast memory regions through the access layer: the CA's FMR verbs, and the AL's
emulation over register_pmr / register_mr for CAs without them (mock CAs with the
capabilities turned off stand in for rdma-core's and rxe's)."""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from ibal.al import AlManager, Ca, Fmr
from ibal.ci import Capabilities, ChannelInterface
from ibal.providers.mock import MockFabric
from ibal.status import (
    InsufficientResources,
    InvalidFmrHandle,
    InvalidParameter,
    Status,
    Unsupported,
)
from ibal.testing.backdoor import TracingCi
from ibal.testing.helpers import Pair, active_port, make_pair, wait_wc
from ibal.types import AccessFlags, FmrCreate, QpType, WcStatus

PAGE = 4096
REMOTE = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ


class Limited(TracingCi):
    """A traced mock CA that declares some capabilities absent."""

    def __init__(self, inner: ChannelInterface, **off: bool) -> None:
        super().__init__(inner)
        self._caps = dataclasses.replace(
            inner.capabilities, **off,
            reasons={**inner.capabilities.reasons, **{k: f"{k} turned off" for k in off}},
        )

    @property
    def capabilities(self) -> Capabilities:
        return self._caps


class Registrar:
    def __init__(self, mgr: AlManager, off: dict[str, bool]) -> None:
        self.mgr, self.off = mgr, off
        self.cis: list[Limited] = []

    def register_ca(self, ci: ChannelInterface) -> None:
        wrapped = Limited(ci, **self.off)
        self.cis.append(wrapped)
        self.mgr.register_ca(wrapped)

    def deregister_ca(self, guid: int) -> None:
        self.mgr.deregister_ca(guid)


@pytest.fixture(params=["native", "over register_pmr", "over register_mr"])
def fenv(request: pytest.FixtureRequest) -> Iterator[tuple[Ca, Limited, MockFabric]]:
    off = {
        "native": {},
        "over register_pmr": {"fmr": False},
        "over register_mr": {"fmr": False, "phys_mr": False},
    }[request.param]
    fab = MockFabric()
    fab.add_ca()
    mgr = AlManager()
    reg = Registrar(mgr, off)
    fab.attach(reg)  # type: ignore[arg-type]
    al = mgr.open_al()
    try:
        yield al.open_ca(al.get_ca_guids()[0]), reg.cis[0], fab
    finally:
        fab.detach()
        mgr.close(timeout=10)
        fab.close()


@pytest.fixture
def env(fenv: tuple[Ca, Limited, MockFabric]) -> tuple[Ca, Limited]:
    return fenv[0], fenv[1]


def loop(ca: Ca) -> Pair:
    port = active_port(ca.query().ports)
    assert port is not None
    return make_pair(ca, port, ca, port, QpType.RC)


def pages(buf: bytearray, first: int, count: int) -> list[memoryview]:
    view = memoryview(buf)
    return [view[i * PAGE : (i + 1) * PAGE] for i in range(first, first + count)]


def address(page: memoryview) -> int:
    return ctypes.addressof((ctypes.c_char * len(page)).from_buffer(page))


def write(pair: Pair, fmr: Fmr, offset: int, data: bytes, rkey: int | None = None) -> WcStatus:
    pair.write(data, remote_addr=fmr.vaddr + offset, rkey=fmr.rkey if rkey is None else rkey)
    return wait_wc(pair.a.cq).status


def test_map_write_remap_uses_the_right_verbs(env: tuple[Ca, Limited]) -> None:
    ca, ci = env
    pair = loop(ca)
    fmr = pair.b.pd.create_fmr(FmrCreate(2, 4, PAGE, REMOTE))
    buf = bytearray(4 * PAGE)
    _, rkey1 = fmr.map(pages(buf, 0, 2))
    assert write(pair, fmr, PAGE - 3, b"abcdef") is WcStatus.SUCCESS
    assert bytes(buf[PAGE - 3 : PAGE + 3]) == b"abcdef"
    _, rkey2 = fmr.map(pages(buf, 2, 2))
    assert rkey2 != rkey1
    assert write(pair, fmr, 0, b"stale", rkey=rkey1) is WcStatus.REM_ACCESS_ERR
    assert bytes(buf[2 * PAGE : 2 * PAGE + 5]) == bytes(5)
    names = {c.name for c in ci.succeeded()}
    caps = ci.capabilities
    if caps.fmr:
        assert fmr.native and {"alloc_fmr", "map_phys_fmr"} <= names
        assert "register_pmr" not in names
    else:
        assert not fmr.native and "alloc_fmr" not in names and "map_phys_fmr" not in names
        made = [c for c in ci.succeeded("register_pmr", "register_mr") if c.result is not None]
        assert len(made) >= 2  # one region per map ...
        assert len(ci.succeeded("deregister_mr")) >= 1  # ... and the previous one goes
        if not caps.phys_mr:
            assert fmr.vaddr == address(pages(buf, 2, 1)[0])  # register_mr: the pages' address


def test_scattered_pages(env: tuple[Ca, Limited]) -> None:
    """Pages from separate buffers: native and register_pmr map them; register_mr cannot."""
    ca, ci = env
    pair = loop(ca)
    fmr = pair.b.pd.create_fmr(FmrCreate(2, 4, PAGE, REMOTE))
    first, second = bytearray(PAGE), bytearray(PAGE)
    caps = ci.capabilities
    if not caps.fmr and not caps.phys_mr:
        with pytest.raises(Unsupported, match=r"not contiguous.*phys_mr turned off"):
            fmr.map([first, second])
        assert not fmr.mapped
        return
    fmr.map([first, second], vaddr=0x40000)
    assert fmr.vaddr == 0x40000  # the requested I/O address is honoured
    assert write(pair, fmr, PAGE - 2, b"wxyz") is WcStatus.SUCCESS
    assert bytes(first[-2:]) + bytes(second[:2]) == b"wxyz"


def test_limits_are_kept_in_every_mode(env: tuple[Ca, Limited]) -> None:
    ca, _ = env
    pd = ca.alloc_pd()
    fmr = pd.create_fmr(FmrCreate(1, 1, PAGE, REMOTE))
    buf = bytearray(2 * PAGE)
    keys = fmr.map(pages(buf, 0, 1))
    with pytest.raises(InsufficientResources):
        fmr.map(pages(buf, 1, 1))
    assert (fmr.lkey, fmr.rkey) == keys
    with pytest.raises(InvalidParameter):
        fmr.map(pages(buf, 0, 2))
    fmr.unmap()
    fmr.map(pages(buf, 1, 1))
    fmr.unmap()
    fmr.destroy()
    with pytest.raises(InvalidFmrHandle):
        fmr.map(pages(buf, 0, 1))


def test_pd_dealloc_frees_a_mapped_fmr_at_the_provider(env: tuple[Ca, Limited]) -> None:
    ca, ci = env
    pd = ca.alloc_pd()
    fmr = pd.create_fmr(FmrCreate(1, 4, PAGE, REMOTE))
    fmr.map([bytearray(PAGE)])
    pd.dealloc(wait=True)
    counts: Any = ci.inner.resource_counts()  # type: ignore[attr-defined]
    assert counts["mr"] == 0 and counts["pd"] == 0


def test_map_refuses_bad_page_lists(env: tuple[Ca, Limited]) -> None:
    ca, _ = env
    fmr = ca.alloc_pd().create_fmr(FmrCreate(2, 4, PAGE, REMOTE))
    with pytest.raises(InvalidParameter):
        fmr.map(bytearray(PAGE))  # a buffer, not a list of pages
    with pytest.raises(InvalidParameter):
        fmr.map([bytes(PAGE)])  # read-only
    with pytest.raises(InvalidParameter):
        fmr.map([bytearray(PAGE)], vaddr=-PAGE)
    with pytest.raises(InvalidParameter):
        ca.alloc_pd().create_fmr("not a create")  # type: ignore[arg-type]


def test_compat_spellings(env: tuple[Ca, Limited]) -> None:
    from ibal import compat as c

    ca, _ = env
    pd = c.ib_alloc_pd(ca)
    fmr = c.mlnx_create_fmr(pd, FmrCreate(2, 2, PAGE, REMOTE))
    buf = bytearray(2 * PAGE)
    assert c.mlnx_map_fmr(fmr, pages(buf, 0, 2)) == (fmr.lkey, fmr.rkey)
    assert c.mlnx_map_phys_fmr(fmr, pages(buf, 1, 1))[1] == fmr.rkey
    c.mlnx_unmap_fmr(fmr)
    c.mlnx_destroy_fmr(fmr)
    assert not fmr.alive


def test_a_failed_map_leaves_the_mapping(fenv: tuple[Ca, Limited, MockFabric]) -> None:
    """The CA refuses the new mapping: the old one keeps its keys and still takes writes."""
    ca, ci, fab = fenv
    pair = loop(ca)
    fmr = pair.b.pd.create_fmr(FmrCreate(1, 4, PAGE, REMOTE))
    buf = bytearray(2 * PAGE)
    keys = fmr.map(pages(buf, 0, 1))
    caps = ci.capabilities
    verb = "map_phys_fmr" if caps.fmr else "register_pmr" if caps.phys_mr else "register_mr"
    fab.faults.fail_verb(verb, Status.INSUFFICIENT_RESOURCES)
    with pytest.raises(InsufficientResources):
        fmr.map(pages(buf, 1, 1))
    assert (fmr.lkey, fmr.rkey) == keys and fmr.mapped
    assert write(pair, fmr, 10, b"kept") is WcStatus.SUCCESS
    assert bytes(buf[10:14]) == b"kept"
    fmr.map(pages(buf, 1, 1))  # the fault was one-shot: the next map works
    assert fmr.rkey != keys[1]
