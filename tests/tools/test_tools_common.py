"""What pingpong and perftest share: option checks and the CA lookup, each with its own error."""

from __future__ import annotations

import pytest

from ibal.al import AccessLayer
from ibal.tools.common import ToolError
from ibal.tools.perftest import PerftestError, PerftestOptions
from ibal.tools.perftest import run as perftest_run
from ibal.tools.pingpong import PingpongError, PingpongOptions
from ibal.tools.pingpong import run as pingpong_run

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")

TOOLS = [(PingpongOptions, PingpongError), (PerftestOptions, PerftestError)]


@pytest.mark.parametrize(("options", "error"), TOOLS)
@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"mtu": 1000}, "invalid MTU 1000"),
        ({"port": 0}, "invalid port 0"),
        ({"port": 65536}, "invalid port 65536"),
        ({"size": 0}, "size and iterations must be positive"),
        ({"iters": 0}, "size and iterations must be positive"),
        ({"rx_depth": 1}, "rx-depth"),
    ],
)
def test_both_tools_refuse_the_same_bad_options(
    options: type, error: type[ToolError], bad: dict[str, int], message: str
) -> None:
    with pytest.raises(error, match=message):
        options(servername="127.0.0.1", **bad).check()


@pytest.mark.parametrize(("options", "error"), TOOLS)
def test_good_defaults_pass(options: type, error: type[ToolError]) -> None:
    options(servername="127.0.0.1").check()
    options(servername="127.0.0.1", mtu=4096, port=1, size=1, iters=1).check()


@pytest.mark.parametrize(
    ("run", "options", "error"),
    [
        (pingpong_run, PingpongOptions, PingpongError),
        (perftest_run, PerftestOptions, PerftestError),
    ],
)
def test_an_unknown_device_is_the_tools_own_error(
    al: AccessLayer, run: object, options: type, error: type[ToolError]
) -> None:
    with pytest.raises(error, match="IB device nosuch not found"):
        run(al, options(servername="127.0.0.1", device="nosuch"), out=lambda _: None)  # type: ignore[operator]
