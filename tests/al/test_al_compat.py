"""The C spellings and the ib_al.h mapping table."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from al_fakes import FakeCi

from ibal import compat
from ibal.al import AccessLayer, Ca, Cq, PnpClass, QpCreate
from ibal.compat import IBAL_MAPPING, ib_sync_destroy
from ibal.status import InvalidPdHandle, InvalidQpHandle
from ibal.types import AccessFlags, AvAttr, DgrmInfo, QpType, SendWr, UdDest

SEED = Path(__file__).resolve().parents[3] / "shared" / "seeds"


def test_mapping_covers_every_entry_once() -> None:
    names = [row[0] for row in IBAL_MAPPING]
    assert len(names) == 191 == len(set(names))
    for name, spelling, status in IBAL_MAPPING:
        assert re.fullmatch(r"done|planned: ibal\.\w+.*|n/a: .+", status), (name, status)
        assert bool(spelling) == (status == "done"), name


def test_mapping_matches_the_reference_entries() -> None:
    seeds = sorted(SEED.glob("000_*.txt")) if SEED.is_dir() else []
    if not seeds:
        pytest.skip("the ib_al.h reference (shared/seeds/000_*.txt) is not beside the repo")
    lines = seeds[0].read_text(errors="replace").splitlines()
    entries = [lines[i + 1].strip() for i, line in enumerate(lines) if line.strip() == "NAME"]
    assert sorted(entries) == sorted(row[0] for row in IBAL_MAPPING)


def test_every_done_call_has_a_c_spelling() -> None:
    for name, _, status in IBAL_MAPPING:
        if status == "done" and re.fullmatch(r"ib_[a-z_]+", name) and not name.endswith("_t"):
            assert hasattr(compat, name), name


def test_c_spellings_drive_the_objects(al: AccessLayer, ci: FakeCi) -> None:
    guids = compat.ib_get_ca_guids(al)
    h_ca = compat.ib_open_ca(al, guids[0], None, "ctx")
    assert isinstance(h_ca, Ca) and h_ca.context == "ctx"
    assert compat.ib_query_ca(h_ca).ca_guid == ci.guid
    h_pd = compat.ib_alloc_pd(h_ca, pd_context="p")
    seen: list[object] = []
    h_cq = compat.ib_create_cq(h_ca, 16, lambda cq, ctx: seen.append(ctx), "c")
    assert isinstance(h_cq, Cq) and compat.ib_query_cq(h_cq) == 16
    h_qp = compat.ib_create_qp(h_pd, QpCreate(QpType.UD, h_cq, h_cq), "q")
    compat.ib_init_dgrm_svc(h_qp, DgrmInfo(port_guid=ci.attr.ports[0].port_guid))
    h_av = compat.ib_create_av(h_pd, AvAttr(port_num=1, dlid=4))
    attr, pd = compat.ib_query_av(h_av)
    assert attr.dlid == 4 and pd is h_pd
    compat.ib_rearm_cq(h_cq)
    compat.ib_post_send(h_qp, SendWr(wr_id=5, ud=UdDest(h_av, 1, 1)))
    assert [w.wr_id for w in compat.ib_poll_cq(h_cq)] == [5]
    mr = compat.ib_reg_mem(h_pd, bytearray(32), AccessFlags.LOCAL_WRITE)
    assert compat.ib_query_mr(mr).lkey == mr.lkey
    compat.ib_dereg_mr(mr)
    destroyed = threading.Event()
    compat.ib_destroy_qp(h_qp, lambda ctx: destroyed.set())
    assert destroyed.wait(10)
    compat.ib_dealloc_pd(h_pd, ib_sync_destroy)  # blocks until destroyed
    with pytest.raises(InvalidPdHandle):
        compat.ib_create_mw(h_pd)
    with pytest.raises(InvalidQpHandle):
        compat.ib_modify_qp(h_cq, None)  # type: ignore[arg-type]
    reg = compat.ib_reg_pnp(al, PnpClass.CA | PnpClass.FLAG_REG_SYNC, lambda rec: None)
    compat.ib_dereg_pnp(reg, ib_sync_destroy)
    compat.ib_close_ca(h_ca, ib_sync_destroy)
    compat.ib_close_al(al)
    assert al.closed


def test_package_exports() -> None:
    import ibal
    import ibal.al

    for name in ("open_al", "AlManager", "QpCreate", "AccessLayer"):
        assert getattr(ibal, name) is getattr(ibal.al, name)
    with pytest.raises(AttributeError):
        ibal.no_such_thing  # type: ignore[attr-defined]  # noqa: B018
