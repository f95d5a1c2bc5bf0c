"""The multicast example of docs/sa.md runs as written, as ``Host`` on ibsim with OpenSM,
and ``saquery`` sees the membership while it is joined and not after."""

from __future__ import annotations

import re
import subprocess
import sys
from ipaddress import IPv6Address
from pathlib import Path

import pytest

from ibal.testing.ibsim import Fabric

REPO = Path(__file__).resolve().parents[2]
HEADING = "### Example: create a group, join it, leave"


def example() -> str:
    text = (REPO / "docs" / "sa.md").read_text()
    after = text.split(HEADING, 1)[1]
    m = re.search(r"```python\n(.*?)```", after, re.S)
    assert m is not None
    return m.group(1)


@pytest.mark.timeout(300)
def test_multicast_example_on_ibsim(ibsim_fabric: Fabric, tmp_path: Path) -> None:
    fabric = ibsim_fabric
    script = tmp_path / "example.py"
    script.write_text(example())
    env = fabric.env_for("Host")
    env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
    p = subprocess.Popen([sys.executable, str(script)], env=env, cwd=fabric.workdir,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)  # fmt: skip
    try:
        assert p.stdout is not None and p.stdin is not None
        line = p.stdout.readline()
        m = re.fullmatch(r"joined (\S+) mlid 0x([0-9a-f]{4})\n", line)
        assert m, (line, p.stderr.read() if p.poll() is not None else "")
        mgid, mlid = m.group(1), int(m.group(2), 16)
        gid = fabric.run(["smpquery", "portinfo", "-D", "0"], "Host").stdout
        prefix = int(re.search(r"GidPrefix:\.+0x([0-9a-f]+)", gid).group(1), 16)  # type: ignore[union-attr]
        guid = fabric.run(["smpquery", "nodeinfo", "-D", "0"], "Host").stdout
        port_guid = int(re.search(r"PortGuid:\.+0x([0-9a-f]+)", guid).group(1), 16)  # type: ignore[union-attr]
        port_gid = str(IPv6Address((prefix << 64) | port_guid))
        query = ["saquery", "--smkey", "1", "MCMR", "--mgid", mgid, "--gid", port_gid]
        seen = fabric.run(query, "Host").stdout
        assert re.search(r"JoinState\.+0x1\b", seen) and re.search(rf"mlid\.+0x{mlid:x}\b", seen)
        out, err = p.communicate("\n", timeout=120)
        assert p.returncode == 0, err[-3000:]
        assert out == "left SUCCESS\n"
        assert "MCMember" not in fabric.run(query, "Host").stdout
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
