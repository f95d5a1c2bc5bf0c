"""The example of docs/cm.md runs as written (mock fabric, real clock) and prints what it says."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")

DOC = Path(__file__).resolve().parents[2] / "docs" / "cm.md"


def _block(heading: str) -> str:
    text = DOC.read_text()
    start = text.index(heading + "\n")
    m = re.compile(r"```python\n(.*?)```", re.S).search(text, start)
    assert m is not None, heading
    return m.group(1)


def test_client_and_server_example() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(_block("### Example: a client and a server"), str(DOC), "exec"), {})
    assert out.getvalue().splitlines() == [
        "client up", "b'hello' b'welcome' RTS", "TIMEWAIT ERROR"]


def test_ibal_shape_example() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(_block("### Example: the IBAL shape"), str(DOC), "exec"), {})
    assert out.getvalue().splitlines() == [
        "req ctx b'hi'", "rep SUCCESS", "rtu", "drep SUCCESS ERROR"]
