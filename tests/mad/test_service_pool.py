"""MAD pools: limits, growth, keys, and the accounting errors IBAL names."""

from __future__ import annotations

import pytest
from mad_world import GET, VENDOR, Net, mad

from ibal.mad import ElementState, MadPool, get_mad_buf, local_mad, put_mad
from ibal.status import (
    InsufficientResources,
    InvalidAlHandle,
    InvalidHandle,
    InvalidParameter,
    InvalidPdHandle,
    InvalidPort,
    InvalidSetting,
    ResourceBusy,
)
from ibal.types import MAD_SIZE


def test_create_checks_its_limits(mock_net: Net) -> None:
    al = mock_net.a.ca  # not an AL
    with pytest.raises(InvalidAlHandle):
        MadPool(al, 1, 2)  # type: ignore[arg-type]
    al_ = mock_net.mgr.open_al()
    with pytest.raises(InvalidSetting):
        MadPool(al_, min_count=4, max_count=2)
    with pytest.raises(InvalidParameter):
        MadPool(al_, min_count=0, max_count=0, grow_size=0)  # could never hand one out
    with pytest.raises(InvalidParameter):
        MadPool(al_, min_count=-1)
    MadPool(al_, min_count=4, max_count=0)  # max 0: no limit
    al_.close()
    with pytest.raises(InvalidAlHandle):
        MadPool(al_)


def test_get_grows_to_max_then_refuses_and_put_makes_room(mock_net: Net) -> None:
    pool = MadPool(mock_net.mgr.open_al(), min_count=2, max_count=5, grow_size=2)
    key = pool.register(mock_net.a.pd)
    got = [key.get_mad() for _ in range(5)]
    assert (pool.capacity, pool.outstanding, key.outstanding) == (5, 5, 5)  # 2, +2, +1
    with pytest.raises(InsufficientResources):
        key.get_mad()
    assert all(get_mad_buf(e) == bytearray(MAD_SIZE) for e in got)  # zero-filled
    got[0].mad[0] = 9
    put_mad(got[0])
    again = key.get_mad()
    assert again.mad == bytearray(MAD_SIZE) and again.state is ElementState.USER
    with pytest.raises(InvalidParameter):
        key.get_mad(100)  # smaller than a MAD


def test_a_pool_that_never_grows(mock_net: Net) -> None:
    key = MadPool(mock_net.mgr.open_al(), min_count=1, grow_size=0).register(mock_net.a.pd)
    e = key.get_mad()
    with pytest.raises(InsufficientResources):
        key.get_mad()
    put_mad([e])
    put_mad([key.get_mad()])


def test_busy_while_elements_are_out(mock_net: Net) -> None:
    pool = MadPool(mock_net.mgr.open_al(), 0, 0, 4)
    k1, k2 = pool.register(mock_net.a.pd), pool.register(mock_net.a.pd)
    e = k1.get_mad()
    with pytest.raises(ResourceBusy):
        pool.destroy()
    with pytest.raises(ResourceBusy):
        k1.dereg()
    k2.dereg()  # nothing out through k2
    with pytest.raises(InvalidParameter):
        k2.dereg()
    with pytest.raises(InvalidParameter):
        k2.get_mad()
    put_mad(e)
    k1.dereg()
    pool.destroy()
    with pytest.raises(InvalidHandle):
        pool.destroy()
    with pytest.raises(InvalidHandle):
        pool.register(mock_net.a.pd)


def test_put_refuses_what_it_cannot_take_back(mock_net: Net) -> None:
    key = MadPool(mock_net.mgr.open_al()).register(mock_net.a.pd)
    a, b = key.get_mad(), key.get_mad()
    with pytest.raises(InvalidParameter):
        put_mad([])
    with pytest.raises(InvalidParameter):
        put_mad([a, a])
    with pytest.raises(InvalidParameter):
        put_mad([a, "not an element"])  # type: ignore[list-item]
    put_mad(a)
    with pytest.raises(InvalidParameter):
        put_mad([b, a])  # a is back already: nothing of the list goes back
    assert b.state is ElementState.USER and key.outstanding == 1
    with pytest.raises(InvalidPdHandle):
        key.pool.register(object())  # type: ignore[arg-type]


def test_an_element_being_sent_belongs_to_the_service(mock_net: Net) -> None:
    net = mock_net
    svc, inbox = net.service(net.a)
    e = svc.pool_key.get_mad()
    e.mad[:] = mad(VENDOR, 0x03)
    e.addr, e.resp_expected, e.timeout_ms = net.b.addr(), True, 100
    svc.send(e)
    assert e.state is ElementState.SENDING
    with pytest.raises(InvalidParameter):
        put_mad(e)
    with pytest.raises(InvalidParameter):
        svc.send(e)  # already on its way
    net.step(0.2)
    assert inbox.sent() is e and e.state is ElementState.USER
    put_mad(e)


def test_local_mad_answers_from_the_ca_as_a_linked_element(mock_net: Net) -> None:
    net = mock_net
    key = MadPool(net.mgr.open_al()).register(net.a.pd)
    req = key.get_mad()
    req.mad[:] = mad(0x01, GET, tid=0x42, attr=0x11)  # SubnGet(NodeInfo)
    req.context1 = "mine"
    resp = local_mad(net.a.ca, net.a.port.port_num, req)
    assert resp.mad[3] == 0x81 and resp.mad[4:6] == b"\0\0" and resp.tid == 0x42
    assert int.from_bytes(resp.mad[64 + 12 : 64 + 20], "big") == net.a.ca.guid  # NodeGUID
    assert resp.request is req and resp.send_context1 == "mine" and key.outstanding == 2
    with pytest.raises(InvalidPort):
        local_mad(net.a.ca, 9, req)
    put_mad([resp, req])
    with pytest.raises(InvalidParameter):
        local_mad(net.a.ca, 1, req)  # back in its pool


def test_closing_the_al_destroys_its_pools_even_with_elements_out(mock_net: Net) -> None:
    al = mock_net.mgr.open_al()
    busy, idle = MadPool(al, 0, 0, 4), MadPool(al, 0, 0, 4)
    key = busy.register(mock_net.a.pd)
    held = key.get_mad()
    idle.register(mock_net.a.pd)
    with pytest.raises(ResourceBusy):
        busy.destroy()  # explicit destroy keeps the rule
    al.close()
    assert busy.destroyed and idle.destroyed
    with pytest.raises(InvalidHandle):
        key.get_mad()
    with pytest.raises(InvalidHandle):
        busy.destroy()
    with pytest.raises(InvalidHandle):
        busy.register(mock_net.a.pd)
    put_mad(held)  # an element out at the close still goes back (it is only counted)
    assert busy.outstanding == 0 and held.state is ElementState.FREE


def test_an_explicitly_destroyed_pool_leaves_its_al(mock_net: Net) -> None:
    al = mock_net.mgr.open_al()
    pool = MadPool(al, 1, 1, 0)
    pool.destroy()
    assert pool.destroyed
    al.close()  # nothing of the pool left for the close to wait for


def test_a_key_goes_with_its_pd(mock_net: Net) -> None:
    """A PD deallocated (or its CA withdrawn) deregisters the pool keys on it: the pool
    lets go of the dead PD, elements out still go back."""
    import gc
    import weakref

    pool = MadPool(mock_net.mgr.open_al(), 0, 0, 4)
    pd = mock_net.a.ca.alloc_pd()
    key, other = pool.register(pd), pool.register(mock_net.a.pd)
    held = key.get_mad()
    pd.dealloc(wait=True)
    with pytest.raises(InvalidParameter):
        key.get_mad()  # deregistered with its PD
    with pytest.raises(InvalidParameter):
        key.dereg()
    put_mad([held, other.get_mad()])
    assert pool.outstanding == 0 and key.outstanding == 0
    dead = weakref.ref(pd)
    del pd, key, held
    gc.collect()
    assert dead() is None  # nothing of the pool holds it
    other.dereg()
    pool.destroy()
