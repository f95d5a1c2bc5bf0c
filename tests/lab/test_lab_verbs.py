"""Real verbs traffic on the guest's kernel rxe0: pyverbs and the standard tools.

One guest boot for the module (`ibal_lab_module_session`).
"""

from __future__ import annotations

import pytest
from guest_peers import start_peer

from ibal.lab import LabSession
from ibal.lab.pytest_plugin import lab_requires

pytestmark = pytest.mark.lab


def test_pyverbs_rdma_write_lands(ibal_lab_module_session: LabSession) -> None:
    lab_requires("pyverbs")
    s = ibal_lab_module_session
    r = start_peer(s, "pyverbs_rdma_write.py", "rxe0", timeout=180).wait()
    assert r.returncode == 0, r.stderr_text
    assert r.stdout_text.startswith("OK 4096 bytes qpn=")


def test_rc_pingpong_between_two_guest_processes(ibal_lab_module_session: LabSession) -> None:
    s = ibal_lab_module_session
    server = s.guest_start(["ibv_rc_pingpong", "-d", "rxe0", "-g", "1", "-n", "20"], timeout=120)
    # The client retries until the server listens (bounded: 200 tries).
    client = s.run(
        "for i in $(seq 200); do"
        " ibv_rc_pingpong -d rxe0 -g 1 -n 20 127.0.0.1 2>>/tmp/refused && exit 0;"
        " sleep 0.1; done; cat /tmp/refused >&2; exit 1",
        timeout=120,
    )
    srv = server.wait(timeout=120)
    assert client.returncode == 0, client.stderr_text
    assert srv.returncode == 0, srv.stderr_text
    for r in (client, srv):
        assert "163840 bytes in" in r.stdout_text  # 20 iterations x 4096 bytes, both ways
        assert "20 iters in" in r.stdout_text
