"""``ibal saquery`` without a fabric: the requests it makes, what it prints, its errors.

A fake ``ask`` records each SA request (method, attribute, record bytes,
ComponentMask, AttributeModifier) and answers from a table of records; the
comparison with ``saquery``'s own output is in ``tests/sa/test_saquery_ibsim.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from ibal import cli
from ibal.mad.service import transport_message
from ibal.sa import SaAnswer
from ibal.status import Status
from ibal.tools import saquery as saq
from ibal.wire.mad import dump, sa
from ibal.wire.mad.consts import MadStatus, Method, SaAttr
from ibal.wire.mad.rmpp import RmppFlags, with_rmpp

NODES = {lid: sa.NODE_RECORD.encode(lid=lid, node_type=1, num_ports=1, port_guid=0x100 + lid,
                                    node_string=f"node{lid}".encode().ljust(64, b"\0"))
         for lid in (1, 3, 4)}  # fmt: skip
PATH = sa.PATH_RECORD.encode(slid=3, dlid=1, numb_path=0, reversible=1, p_key=0xFFFF, mtu=3,
                             mtu_selector=2, sgid=bytes(15) + b"\3", dgid=bytes(15) + b"\1")


class FakeSa:
    """``ask`` for :func:`saq.saquery`: records what was asked, answers from ``answers``."""

    def __init__(self, answers: dict[int, Callable[[bytes, int], tuple[bytes, ...]]]) -> None:
        self.answers = answers
        self.asked: list[tuple[int, int, bytes, int, int]] = []

    def __call__(self, method: int, attr_id: int, data: bytes = b"", comp_mask: int = 0,
                 attr_mod: int = 0) -> tuple[bytes, ...]:  # fmt: skip
        self.asked.append((method, attr_id, data, comp_mask, attr_mod))
        return self.answers[attr_id](data, comp_mask)


def nodes(data: bytes, mask: int) -> tuple[bytes, ...]:
    if mask == 0:
        return tuple(NODES.values())
    lid = int(sa.NODE_RECORD.decode(data)["lid"])
    return (NODES[lid],) if lid in NODES else ()


def test_strtoul_reads_numbers_as_c_does() -> None:
    assert [saq.strtoul(t) for t in ("10", "0x10", "010", "0X1f", "12abc", "", "abc", "0")] == \
        [10, 16, 8, 31, 12, 0, 0, 0]  # fmt: skip


def test_node_record_by_lid_is_a_get_table_with_the_lid_component() -> None:
    ask = FakeSa({SaAttr.NODE_RECORD: nodes})
    text = saq.saquery(ask, saq.Options(args=["NR", "0x3"]))
    assert text == dump.saquery_node_record(NODES[3])
    [(method, attr, data, mask, mod)] = ask.asked
    assert (method, attr, mod) == (Method.GET_TABLE, SaAttr.NODE_RECORD, 0)
    assert mask == sa.component_mask(sa.NODE_RECORD, ["lid"]) == 1
    assert sa.NODE_RECORD.decode(data)["lid"] == 3
    # A name is looked up in every NodeRecord (one GetTable without components) first.
    ask = FakeSa({SaAttr.NODE_RECORD: nodes})
    assert saq.saquery(ask, saq.Options(args=["node4"])) == dump.saquery_node_record(NODES[4])
    assert [a[3] for a in ask.asked] == [0, 1]
    with pytest.raises(saq.SaqueryError, match='Failed to find lid for "nosuch"'):
        saq.saquery(FakeSa({SaAttr.NODE_RECORD: nodes}), saq.Options(args=["NR", "nosuch"]))
    with pytest.raises(saq.SaqueryError, match="Invalid lid"):
        saq.saquery(FakeSa({SaAttr.NODE_RECORD: nodes}), saq.Options(args=["NR", "70000"]))


def test_path_record_src_to_dst_masks_as_saquery() -> None:
    ask = FakeSa({SaAttr.NODE_RECORD: nodes, SaAttr.PATH_RECORD: lambda d, m: (PATH,)})
    p = saq.Params(numb_path=0x7F, mtu=0x84)
    opts = saq.Options(query_type=SaAttr.PATH_RECORD, src_to_dst="node3:1", params=p)
    assert saq.saquery(ask, opts) == dump.saquery_path_record(PATH)
    method, attr, data, mask, _ = ask.asked[-1]
    assert (method, attr) == (Method.GET_TABLE, SaAttr.PATH_RECORD)
    want = ["slid", "dlid", "numb_path", "mtu", "mtu_selector"]
    assert mask == sa.component_mask(sa.PATH_RECORD, want)
    got = sa.PATH_RECORD.decode(data)
    assert (got["slid"], got["dlid"], got["numb_path"], got["mtu_selector"], got["mtu"]) == \
        (3, 1, 0x7F, 2, 4)  # fmt: skip


def test_queries_by_name_and_flag() -> None:
    seen: list[int] = []

    def answer(attr: int) -> Callable[[bytes, int], tuple[bytes, ...]]:
        return lambda d, m: (seen.append(attr), ())[1]

    ask = FakeSa({a: answer(a) for a in (SaAttr.SERVICE_RECORD, SaAttr.MCMEMBER_RECORD,
                                         SaAttr.LINK_RECORD, SaAttr.PORT_INFO_RECORD,
                                         SaAttr.INFORM_INFO_RECORD, SaAttr.GUID_INFO_RECORD)})
    for o in (saq.Options(args=["sr"]), saq.Options(args=["MCMemberRecord"]),
              saq.Options(query_type=SaAttr.LINK_RECORD), saq.Options(args=["PIR", "3/1"]),
              saq.Options(args=["IIR", "fe80::1"]), saq.Options(args=["GIR", "3/0"]),
              saq.Options(command=saq.Command.MCGROUPS)):  # fmt: skip
        assert saq.saquery(ask, o) == ""
    assert seen == [SaAttr.SERVICE_RECORD, SaAttr.MCMEMBER_RECORD, SaAttr.LINK_RECORD,
                    SaAttr.PORT_INFO_RECORD, SaAttr.INFORM_INFO_RECORD, SaAttr.GUID_INFO_RECORD,
                    SaAttr.MCMEMBER_RECORD]  # fmt: skip
    pir = ask.asked[3]
    assert pir[3] == sa.component_mask(sa.PORT_INFO_RECORD, ["endport_lid", "port_num"])
    # -s: PortInfoRecords with a CapabilityMask bit, AttributeModifier bit 31.
    ask = FakeSa({SaAttr.PORT_INFO_RECORD: lambda d, m: ()})
    text = saq.saquery(ask, saq.Options(command=saq.Command.ISSM))
    assert text == "IsSM ports\n\nIsSMdisabled ports\n"
    assert [a[4] for a in ask.asked] == [1 << 31, 1 << 31]
    with pytest.raises(saq.SaqueryError, match="not supported"):
        saq.saquery(ask, saq.Options(args=["SWIR"]))


def test_node_lists_print_as_saquery() -> None:
    ask = FakeSa({SaAttr.NODE_RECORD: nodes})
    run = saq.saquery
    assert run(ask, saq.Options(command=saq.Command.NODE_RECORD,
                                node_print=saq.NodePrint.ALL_DESC)) == \
        '   LID "name"\n================\n     1  "node1"\n     3  "node3"\n     4  "node4"\n'
    assert run(ask, saq.Options(args=["node3"], command=saq.Command.NODE_RECORD,
                                node_print=saq.NodePrint.LID_ONLY)) == "3\n"
    assert run(ask, saq.Options(args=["4"], command=saq.Command.NODE_RECORD,
                                node_print=saq.NodePrint.NAME_OF_LID)) == "node4\n"
    assert run(ask, saq.Options(args=["node1"], command=saq.Command.NODE_RECORD,
                                node_print=saq.NodePrint.GUID_ONLY)) == "0x0000000000000101\n"
    with pytest.raises(saq.SaqueryError, match="name not specified"):
        run(ask, saq.Options(command=saq.Command.NODE_RECORD, node_print=saq.NodePrint.LID_ONLY))


class FakePort:
    def __init__(self, answer: SaAnswer) -> None:
        self.answer = answer

    def request(self, *a: Any, **kw: Any) -> Any:
        answer = self.answer

        class Req:
            def wait(self) -> SaAnswer:
                return answer

        return Req()


@pytest.mark.parametrize(("answer", "words"), [
    (SaAnswer(Status.REMOTE_ERROR, MadStatus.SA_NO_RECORDS, mad=b"x"), "0x0300 (SA_NO_RECORDS)"),
    (SaAnswer(Status.ERROR, mad=b"x", detail="the SA's answer is an RMPP transfer cut short"),
     "cut short; not printing a partial list"),
    (SaAnswer(Status.TIMEOUT, detail="no answer from the SA after 4 tries"), "no answer"),
])  # fmt: skip
def test_failed_answers_are_errors(answer: SaAnswer, words: str) -> None:
    ask = saq.port_asker(FakePort(answer))  # type: ignore[arg-type]
    with pytest.raises(saq.SaqueryError, match=words.replace("(", r"\(").replace(")", r"\)")):
        saq.saquery(ask, saq.Options(args=["SR"]))


def test_a_one_mad_answer_written_short_is_whole() -> None:
    """OpenSM under umad2sim: one MAD, RMPP Active only, its exact length (no kernel RMPP
    to add the Last flag): whole.  At 256 bytes without Last it is a first segment alone."""
    from ibal.wire.mad import header

    mad = header.build(0x03, Method.GET_TABLE_RESP, SaAttr.PATH_RECORD, tid=1, data=PATH)
    mad = with_rmpp(bytes(mad), version=0, type=0, resp_time=0, flags=RmppFlags.ACTIVE,
                    status=0, segment_number=0, payload_length=0)  # fmt: skip
    short = mad[: 56 + 64]
    whole = transport_message(short)
    assert whole is not None and len(whole) == 120 and whole[56:] == PATH
    assert transport_message(mad) is None


def test_cli_parses_saquery_options(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[saq.Options] = []

    class Port:
        def close(self) -> None:
            pass

    def fake_run(ask: Any, opts: saq.Options) -> str:
        asked.append(opts)
        return "printed\n"

    monkeypatch.setattr(saq, "open_port", lambda al, ca, port: Port())
    monkeypatch.setattr(saq, "saquery", fake_run)
    runner = CliRunner()
    r = runner.invoke(cli.main, ["saquery", "--provider", "mock", "-p", "--src-to-dst", "3:1",
                                 "--sl", "2", "-M", "0x84"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert r.output == "printed\n"
    o = asked[-1]
    assert (o.query_type, o.src_to_dst, o.params.numb_path, o.params.sl, o.params.mtu) == \
        (SaAttr.PATH_RECORD, "3:1", 0x7F, 2, 0x84)  # fmt: skip
    r = runner.invoke(cli.main, ["saquery", "--provider", "mock", "--sgid-to-dgid",
                                 "fe80::1-fe80::2"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert asked[-1].params.dgid == bytes.fromhex("fe80" + "0" * 27 + "2")
    r = runner.invoke(cli.main, ["saquery", "--provider", "mock", "-D", "-s", "NR", "5"])
    assert r.exit_code == 0 and asked[-1].command is saq.Command.ISSM
    assert asked[-1].node_print is saq.NodePrint.ALL_DESC and tuple(asked[-1].args) == ("NR", "5")
    r = runner.invoke(cli.main, ["saquery", "--provider", "mock", "--src-to-dst", "3"])
    assert r.exit_code == 1 and "SRC:DST" in r.output


def test_open_port_picks_the_ca_and_port(al: Any) -> None:
    """``-C``/``-P`` on the two-CA mock: the named CA's port, errors naming what exists."""
    names = []
    for guid in al.get_ca_guids():
        ca = al.open_ca(guid)
        names.append(ca.name)
        ca.close(wait=True)
    port = saq.open_port(al, names[1], 1)
    try:
        assert port.ca.name == names[1] and port.port_num == 1
    finally:
        port.close()
    with pytest.raises(saq.SaqueryError, match=r"no active port on CA nosuch \(seen: "):
        saq.open_port(al, "nosuch", None)
    with pytest.raises(saq.SaqueryError, match=rf"no active port 9 on any CA \(seen: {names[0]}/1"):
        saq.open_port(al, None, 9)
