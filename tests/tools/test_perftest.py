"""``ibal perftest`` on the mock: both ends in two threads over localhost TCP, one fabric.

Figures are not asserted (speed is measured in benchmarks/); the table's shape
and that the bytes moved are.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ibal.tools.perftest import (
    BW_HEADER,
    LAT_HEADER,
    RESULT_LINE,
    BwResult,
    LatResult,
    PerftestError,
    PerftestOptions,
    PerftestResult,
    bw_peak,
    run,
)

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")


Pair = Callable[..., tuple[PerftestResult, PerftestResult]]


def perftest(pair: Pair, test: str, **kw: object) -> tuple[PerftestResult, PerftestResult]:
    return pair(run, PerftestOptions, test=test, **kw)


def _table(res: PerftestResult, header: str) -> list[str]:
    i = res.lines.index(header)
    assert res.lines[i - 1] == RESULT_LINE and res.lines[-1] == RESULT_LINE
    return res.lines[i + 1 : -1]


@pytest.mark.parametrize("test", ["write_bw", "read_bw", "send_bw"])
def test_bw_tests_move_the_bytes_and_print_perftests_table(pair: Pair, test: str) -> None:
    server, client = perftest(pair, test, size=4096, iters=300, tx_depth=32, cq_mod=8)
    assert isinstance(client.result, BwResult) and client.result.iters == 300
    for res in (server, client):
        (row,) = _table(res, BW_HEADER)
        fields = row.split()
        assert fields[:2] == ["4096", "300"] and len(fields) == 5
        assert all(float(f) > 0 for f in fields[2:])
    if test == "send_bw":
        assert server.received == 300
    # The bytes moved: the client's 0xC1 source lands at the server (write, send), the
    # server's 0x5E first half lands in the client's second half (read).
    if test == "read_bw":
        assert client.buffer[4096:] == b"\x5e" * 4096
    else:
        assert server.buffer[:4096] == b"\xc1" * 4096
    title = {"write_bw": "RDMA_Write BW Test", "read_bw": "RDMA_Read BW Test"}.get(
        test, "Send BW Test"
    )
    assert client.lines[1].strip() == title


def test_window_and_cq_mod_that_do_not_divide_the_iterations(pair: Pair) -> None:
    # The last signaled WR covers the remainder; a miscount would hang or stop short.
    server, client = perftest(pair, "send_bw", size=8, iters=77, tx_depth=10, cq_mod=4, rx_depth=6)
    assert server.received == 77 and client.result.iters == 77
    assert server.buffer[:8] == b"\xc1" * 8


@pytest.mark.parametrize("post_list", [1, 3])
def test_post_lists_move_every_message(pair: Pair, post_list: int) -> None:
    # lists that divide neither the window nor the iterations: each WR is posted once
    server, client = perftest(pair, "send_bw", size=8, iters=77, tx_depth=10, cq_mod=4,
                              rx_depth=6, post_list=post_list)  # fmt: skip
    assert server.received == 77 and client.result.iters == 77
    assert f" Post List       : {post_list}" in client.lines
    assert server.buffer[:8] == b"\xc1" * 8


def test_a_post_list_longer_than_the_window_is_refused() -> None:
    with pytest.raises(PerftestError, match="post-list"):
        PerftestOptions(tx_depth=4, post_list=5).check()
    with pytest.raises(PerftestError, match="post-list"):
        PerftestOptions(post_list=-1).check()


@pytest.mark.parametrize("test", ["send_lat", "write_lat"])
def test_latency_tests_print_perftests_table(pair: Pair, test: str) -> None:
    server, client = perftest(pair, test, size=8, iters=40, rx_depth=4, cq_mod=5)
    for res in (server, client):
        assert isinstance(res.result, LatResult)
        (row,) = _table(res, LAT_HEADER)
        fields = row.split()
        assert fields[:2] == ["8", "40"] and len(fields) == 9
        t_min, t_max, typ, avg = (float(f) for f in fields[2:6])
        assert 0 < t_min <= typ <= t_max and t_min <= avg <= t_max
    assert len(client.result.samples) == 40  # type: ignore[union-attr]


def test_mismatched_parameters_are_refused(pair: Pair) -> None:
    server, client = pair(run, PerftestOptions, iters=5, server={"size": 8}, client={"size": 16},
                          raising=False)  # fmt: skip
    for end in (server, client):
        assert isinstance(end, PerftestError) and "must match" in str(end)


def test_result_rows_use_perftests_formats() -> None:
    bw = BwResult(65536, 200, 0.7056, 54.81)
    assert bw.row() == " 65536      200              54.81              17.72  \t\t   0.000283"
    lat = LatResult(8, 4, [1.0, 2.0, 3.0, 4.0])
    assert lat.row().split() == ["8", "4", "1.00", "4.00", "2.50", "2.50", "1.12", "4.00", "4.00"]


def test_peak_is_the_best_window() -> None:
    marks = [(1_000_000_000, 10), (1_500_000_000, 20), (3_500_000_000, 30)]
    assert bw_peak(marks, 0, MB := 1 << 20, 1) == pytest.approx(20.0)
    assert MB == 1 << 20
