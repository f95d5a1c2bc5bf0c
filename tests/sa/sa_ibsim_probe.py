"""Run under umad2sim (ibsim) as a node: SA requests through ibal.sa, one per stdin line.

Each stdin line is a JSON object; the probe answers each with one JSON line
on stdout (flushed), so a test can change the fabric (stop OpenSM) between
two requests of the same process.  Objects:

``{"op": "request", "method": 1, "attr": 17, "data": HEX, "mask": INT,
"timeout_ms": INT, "retry_cnt": INT}`` -> ``{"status", "mad_status",
"method", "records": [HEX...], "detail"}``

``{"op": "py", "fn": "node_records", "kwargs": {...}}`` -> one of
``ibal.sa``'s Pythonic queries on this port: ``{"status", "records": [HEX...],
"mad_status", "detail"}`` (``status`` the name of the exception's status, or
SUCCESS), and ``{"op": "info"}`` -> the port's GUID, GID, LID and SM LID.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main() -> int:
    import ibal
    from ibal.sa import SaAnswer, SaPort

    al = ibal.open_al()
    ca_guid = next(g for g in al.get_ca_guids() if al.open_ca(g).name == "ibsim0")
    port_attr = al.query_ca_by_guid(ca_guid).ports[0]
    port = SaPort.open(al, port_attr.port_guid)

    def answer(a: SaAnswer) -> dict[str, Any]:
        return {"status": a.status.name, "mad_status": a.mad_status, "method": a.method,
                "attr": a.attr_id, "records": [r.hex() for r in a.records], "detail": a.detail}

    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        op = req["op"]
        out: dict[str, Any]
        if op == "info":
            p = al.query_ca_by_guid(ca_guid).ports[0]
            out = {"port_guid": p.port_guid, "lid": p.lid, "sm_lid": p.sm_lid,
                   "gid": str(p.gids[0]) if p.gids else ""}
        elif op == "py":
            import ibal.sa
            from ibal.status import IbError

            kwargs = dict(req.get("kwargs", {}))
            for k in ("record",):
                if k in kwargs:
                    kwargs[k] = bytes.fromhex(kwargs[k])
            for k in ("mtu", "rate", "packet_life"):
                if isinstance(kwargs.get(k), list):
                    kwargs[k] = tuple(kwargs[k])
            try:
                recs = getattr(ibal.sa, req["fn"])(al, *req.get("args", []),
                                                    port_guid=port_attr.port_guid, **kwargs)
                out = {"status": "SUCCESS", "records": [r.raw.hex() for r in recs]}
            except IbError as exc:
                out = {"status": exc.status.name, "records": [], "detail": str(exc),
                       "mad_status": getattr(exc, "mad_status", 0)}
        elif op == "request":
            r = port.request(req["method"], req["attr"], bytes.fromhex(req.get("data", "")),
                             req.get("mask", 0), timeout_ms=req.get("timeout_ms", 1000),
                             retry_cnt=req.get("retry_cnt", 3))  # fmt: skip
            out = answer(r.wait(120))
        else:
            out = {"error": f"unknown op {op!r}"}
        print(json.dumps(out), flush=True)
    al.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
