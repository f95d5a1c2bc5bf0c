"""The per-CA event thread, driven through pipes standing in for uverbs event fds."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from ibal.providers.rdma_core.events import AsyncDispatch, EventLoop


class NoEvent(Exception):
    pass


class Obj:
    def __init__(self) -> None:
        self.alive = True


def wait(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.005)


@pytest.fixture
def pipes() -> Iterator[list[tuple[int, int]]]:
    made: list[tuple[int, int]] = []
    yield made
    for r, w in made:
        for fd in (r, w):
            with contextlib.suppress(OSError):
                os.close(fd)


def reader(fd: int) -> Callable[[], None]:
    def read() -> None:
        os.read(fd, 1)

    return read


def new_pipe(pipes: list[tuple[int, int]]) -> tuple[int, int]:
    r, w = os.pipe()
    pipes.append((r, w))
    return r, w


def test_completion_events_are_read_then_delivered(pipes: list[tuple[int, int]]) -> None:
    loop = EventLoop("t", on_async=lambda: None, rdma_error=NoEvent)
    loop.start(None)
    r, w = new_pipe(pipes)
    cq = Obj()
    got: list[str] = []

    def read_event() -> None:
        os.read(r, 1)
        got.append("read")

    loop.add_channel(r, cq, read_event, lambda: got.append("upcall"))
    os.write(w, b"x")
    wait(lambda: got == ["read", "upcall"])
    destroyed: list[bool] = []
    loop.retire(cq, lambda: destroyed.append(True), r)
    assert destroyed == [True] and not cq.alive
    os.write(w, b"x")
    time.sleep(0.1)
    assert got == ["read", "upcall"]  # nothing after retire
    loop.stop()


def test_retire_waits_for_the_upcall_in_flight(pipes: list[tuple[int, int]]) -> None:
    loop = EventLoop("t", on_async=lambda: None, rdma_error=NoEvent)
    loop.start(None)
    r, w = new_pipe(pipes)
    cq = Obj()
    entered, release = threading.Event(), threading.Event()
    order: list[str] = []

    def upcall() -> None:
        entered.set()
        release.wait(5)
        order.append("upcall done")

    loop.add_channel(r, cq, reader(r), upcall)
    os.write(w, b"x")
    assert entered.wait(5)
    t = threading.Thread(target=loop.retire, args=(cq, lambda: order.append("destroyed"), r))
    t.start()
    time.sleep(0.1)
    assert order == []  # destroy blocked behind the running upcall
    release.set()
    t.join(5)
    assert order == ["upcall done", "destroyed"]
    loop.stop()


def test_async_event_acknowledged_after_its_upcall(pipes: list[tuple[int, int]]) -> None:
    r, w = new_pipe(pipes)
    target = Obj()
    order: list[str] = []

    def on_async() -> AsyncDispatch | None:
        if not os.read(r, 1):
            raise NoEvent
        return target, lambda: order.append("upcall"), lambda: order.append("ack")

    loop = EventLoop("t", on_async=on_async, rdma_error=NoEvent)
    loop.start(r)
    os.write(w, b"e")
    wait(lambda: order == ["upcall", "ack"])
    loop.stop()


def test_a_raising_callback_does_not_kill_the_thread(pipes: list[tuple[int, int]]) -> None:
    loop = EventLoop("t", on_async=lambda: None, rdma_error=NoEvent)
    loop.start(None)
    r, w = new_pipe(pipes)
    calls: list[int] = []

    def upcall() -> None:
        calls.append(1)
        raise RuntimeError("consumer bug")

    loop.add_channel(r, Obj(), reader(r), upcall)
    os.write(w, b"x")
    wait(lambda: len(calls) == 1)
    os.write(w, b"x")
    wait(lambda: len(calls) == 2)
    loop.stop()
