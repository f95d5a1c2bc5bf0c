"""Run under umad2sim (ibsim) as one node: service registrations and ServiceRecord queries.

Reads JSON commands, one per line, on stdin and answers each with one JSON
line on stdout (``test_sa_service_ibsim.py`` drives one of these per node):

* ``{"op": "register", "key", "name", "service_id", "lease", "renew", "data"}``
  -> the first outcome (status, SA MAD status, the record the SA answered, hex)
* ``{"op": "query", "by": "name" | "id" | "all" | "table", "name", "service_id"}`` -> the
  SA's status and the ServiceRecords found (hex), asked through ``SaPort``
* ``{"op": "register_address" | "lookup_address", "key", "address"}`` -> ATS
* ``{"op": "stats", "key"}`` -> the registration's request counts and the outcomes
  its callback got (attempt, status)
* ``{"op": "dereg", "key"}`` -> the Delete's status once the SA answered it
* ``{"op": "quit"}``
"""

from __future__ import annotations

import json
import sys
from typing import Any

WAIT = 30.0


def main() -> int:
    import ibal
    from ibal.sa.ats import ats_address, lookup_address, register_address
    from ibal.sa.port import SaPort
    from ibal.sa.service import RegSvcRec, ServiceRecord, ServiceRegistration, register_service
    from ibal.wire.mad.consts import Method, SaAttr
    from ibal.wire.mad.sa import SERVICE_RECORD, component_mask

    al = ibal.open_al()
    regs: dict[str, ServiceRegistration] = {}
    seen: dict[str, list[RegSvcRec]] = {}
    sa = SaPort.open(al)

    def reply(obj: dict[str, Any]) -> None:
        print(json.dumps(obj), flush=True)

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "quit":
            break
        if op == "register":
            outcomes = seen.setdefault(cmd["key"], [])
            reg = register_service(
                al, name=cmd["name"], service_id=int(cmd["service_id"]),
                lease=cmd.get("lease"), renew=bool(cmd.get("renew", True)),
                timeout_ms=int(cmd.get("timeout_ms", 1000)), retry_cnt=int(cmd.get("retry_cnt", 3)),
                p_key=int(cmd.get("p_key", 0xFFFF)), callback=outcomes.append,
                data={k: int(v) for k, v in cmd.get("data", {}).items()},
            )  # fmt: skip
            regs[cmd["key"]] = reg
            try:
                rec = reg.wait(WAIT)
            except ibal.status.IbError as exc:
                reply({"status": exc.status.name, "detail": str(exc),
                       "resp_status": outcomes[0].resp_status})
                continue
            reply({"status": rec.req_status.name, "resp_status": rec.resp_status,
                   "record": rec.svc_rec.encode().hex(), "gid": str(rec.svc_rec.service_gid),
                   "port_guid": reg.port_guid})  # fmt: skip
        elif op == "query":
            by = cmd["by"]
            if by == "all":  # no component: every record (one MAD holds one)
                method, data, mask = Method.GET, b"", 0
            elif by == "table":  # every record, as a GetTable (ibsim cuts its RMPP answer)
                method, data, mask = Method.GET_TABLE, b"", 0
            else:
                want = ServiceRecord(service_id=int(cmd.get("service_id", 0)),
                                     service_name=cmd.get("name", "").encode())  # fmt: skip
                field = "service_name" if by == "name" else "service_id"
                method, data = Method.GET, want.encode()
                mask = component_mask(SERVICE_RECORD, [field])
            ans = sa.request(method, SaAttr.SERVICE_RECORD, data, mask).wait(WAIT)
            reply({"status": ans.status.name, "mad_status": ans.mad_status, "detail": ans.detail,
                   "records": [bytes(r[: SERVICE_RECORD.size]).hex() for r in ans.records]})
        elif op == "register_address":
            reg = register_address(al, cmd["address"])
            regs[cmd["key"]] = reg
            rec = reg.wait(WAIT)
            reply({"status": rec.req_status.name, "gid": str(rec.svc_rec.service_gid),
                   "address": str(ats_address(rec.svc_rec))})
        elif op == "lookup_address":
            reply({"gids": [str(g) for g in lookup_address(al, cmd["address"])]})
        elif op == "stats":
            reg = regs[cmd["key"]]
            reply({"stats": reg.stats, "alive": reg.alive,
                   "outcomes": [[o.attempt.value, o.req_status.name] for o in seen[cmd["key"]]]})
        elif op == "dereg":
            reg = regs.pop(cmd["key"])
            reg.dereg(wait=True, timeout=WAIT)
            reply({"deleted": None if reg.deleted is None else reg.deleted.name,
                   "mad_status": reg.deleted_mad_status})
    sa.close()
    al.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
