"""The administrator's tools on the command line, without a fabric: registration, help,
schemas, and the refusal on RoCE ports."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import click
import jsonschema
import pytest
from click.testing import CliRunner

from ibal.cli import main
from ibal.tools.commands import GROUPS, LAZY
from ibal.tools.diagcli import SCHEMAS, schema


def test_help_lists_every_command_under_its_heading_and_imports_no_tool() -> None:
    code = ("import sys; from ibal.cli import main\n"
            "try: main(['--help'])\n"
            "except SystemExit: pass\n"
            "print([m for m in sys.modules if m.startswith('ibal.tools.')])")  # fmt: skip
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    text, imported = r.stdout.rsplit("\n", 2)[0], r.stdout.strip().splitlines()[-1]
    # the command table and the options every command shares; no tool module
    assert sorted(ast.literal_eval(imported)) == ["ibal.tools.cliopts", "ibal.tools.commands"]
    heads = {ln[:-1] for ln in text.splitlines() if ln[:1].isupper() and ln.endswith(":")}
    known = {*LAZY, *main.commands, "lab", "nvme"}
    listed = {t for t, names in GROUPS if any(n in known for n in names)}
    assert heads - {"Options"} == listed
    for name in LAZY:  # each under the heading of its group, with its one line
        title = next(t for t, names in GROUPS if name in names)
        section = text.split(title + ":", 1)[1].split("\n\n", 1)[0]
        assert f"  {name} " in section, name


# prints nothing to read: it writes a new cache file
_NO_OUTPUT = {"ibcacheedit"}


@pytest.mark.parametrize("name", sorted(LAZY))
def test_each_lazy_command_loads_with_its_name(name: str) -> None:
    cmd = main.get_command(click.Context(main), name)
    assert isinstance(cmd, click.Command) and cmd.name == name
    opts = {o for p in cmd.params for o in getattr(p, "opts", [])}
    assert ("--json" in opts) is (name not in _NO_OUTPUT)


def test_every_schema_is_a_valid_json_schema() -> None:
    files = sorted(SCHEMAS.glob("*.schema.json"))
    assert files
    for f in files:
        jsonschema.Draft202012Validator.check_schema(json.loads(f.read_text()))
    for name in set(LAZY) - _NO_OUTPUT:
        assert schema(name)["type"] == "object"


@pytest.mark.parametrize("args", [["ibhosts"], ["ibaddr"], ["smpdump", "1", "0x11"],
                                  ["ibping", "-c", "1", "1"], ["iblinkinfo"],
                                  ["ibportstate", "1", "1"]])  # fmt: skip
def test_on_roce_the_tools_say_they_have_no_meaning(args: list[str]) -> None:
    r = CliRunner().invoke(main, [*args, "--provider", "rxe", "-o",
                                  "devices=rxe_adm0=127.0.24.10"])  # fmt: skip
    assert r.exit_code == 1, r.output
    assert r.output.count("\n") == 1 and "no meaning on RoCE" in r.output


def test_ibstat_and_ibstatus_describe_a_roce_port() -> None:
    """ibstat and ibstatus have a meaning on RoCE (the C tools show Ethernet ports too)."""
    opts = ["--provider", "rxe", "-o", "devices=rxe_adm1=127.0.24.11"]
    r = CliRunner().invoke(main, ["ibstat", *opts, "--json"])
    assert r.exit_code == 0, r.output
    (ca,) = json.loads(r.output)["cas"]
    jsonschema.validate(json.loads(r.output), schema("ibstat"))
    (port,) = ca["ports"]
    assert (ca["CAName"], port["LinkLayer"], port["PortState"]) == ("rxe_adm1", "Ethernet",
                                                                    "Active")
    r = CliRunner().invoke(main, ["ibstatus", "rxe_adm1:1", *opts])
    assert r.exit_code == 0, r.output
    assert "\tlink_layer:\t Ethernet\n" in r.output and "\tstate:\t\t 4: ACTIVE\n" in r.output
    r = CliRunner().invoke(main, ["ibstatus", "nosuch", *opts])
    assert r.exit_code == 1 and "device 'nosuch'" in r.output


def test_devices_and_info_json_validate_and_match_the_cas() -> None:
    r = CliRunner().invoke(main, ["devices", "-p", "mock", "-o", "cas=3", "--json"])
    assert r.exit_code == 0, r.output
    devs = json.loads(r.output)
    jsonschema.validate(devs, schema("devices"))
    assert [d["CAName"] for d in devs["cas"]] == ["mock0", "mock1", "mock2"]
    r = CliRunner().invoke(main, ["info", "mock1", "-p", "mock", "-o", "cas=3", "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    jsonschema.validate(info, schema("info"))
    (ca,) = info["cas"]
    assert ca["NodeGUID"] == devs["cas"][1]["NodeGUID"] and ca["ports"][0]["PortState"] == "ACTIVE"
    assert "port_counters" in ca["NotSupported"]


def _listening(port: int) -> bool:
    """A TCP socket listens on ``port`` (without connecting: the server accepts one)."""
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                    return True
    return False


@pytest.mark.timeout(420)
def test_perftest_json_on_two_rxe_ends() -> None:
    """``ibal perftest --json``: both ends' results, as numbers, against the schema; the
    server and client are two processes, each with a userspace rxe device on loopback
    (addresses of 127.0.24.0/24: other tests take 127.0.0.x)."""
    import socket

    from ibal.testing.helpers import wait_until

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = ["perftest", "write_bw", "--provider", "rxe", "-s", "4096", "-n", "50", "-p",
              str(port), "--json"]  # fmt: skip
    server = subprocess.Popen([sys.executable, "-m", "ibal.cli", *common, "-o",
                               "devices=rxe_pj0=127.0.24.2"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_until(lambda: _listening(port) or server.poll() is not None, "perftest server",
                   timeout=60)  # fmt: skip
        client = subprocess.run([sys.executable, "-m", "ibal.cli", *common, "-o",
                                 "devices=rxe_pj1=127.0.24.3", "127.0.0.1"],
                                capture_output=True, text=True, timeout=180)  # fmt: skip
        out, err = server.communicate(timeout=180)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert client.returncode == 0 and server.returncode == 0, (client.stderr, err)
    mine, theirs = json.loads(client.stdout), json.loads(out)
    for res in (mine, theirs):
        jsonschema.validate(res, schema("perftest"))
        assert (res["Test"], res["Bytes"], res["Iterations"]) == ("write_bw", 4096, 50)
        assert res["BWAverageMBps"] > 0
    assert mine == theirs  # the server prints the client's figures, as perftest's does


def test_a_diagnostic_imports_only_what_it_uses() -> None:
    """``smpquery`` loads neither the sweep nor another tool's module; ``ibaddr`` loads its
    own module and none of the other tools'."""
    code = ("import sys; from ibal.cli import main\n"
            "for args in (['smpquery', 'nodeinfo', '1'], ['ibaddr']):\n"
            "    try: main([*args, '--provider', 'mock'])\n"
            "    except SystemExit as e: assert not e.code, e.code\n"
            "    print(sorted(m for m in sys.modules if m.startswith(('ibal.tools.',\n"
            "                                                      'ibal.mad.discover'))))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    after_smpquery, after_ibaddr = [ln for ln in r.stdout.splitlines() if ln.startswith("[")]
    # ibal.tools.cliopts: the options every command shares, loaded with the CLI itself
    assert after_smpquery == "['ibal.tools.cliopts', 'ibal.tools.diags']"
    assert after_ibaddr == ("['ibal.tools.addr', 'ibal.tools.cliopts', 'ibal.tools.commands', "
                            "'ibal.tools.diagcli', 'ibal.tools.diags']")  # fmt: skip
