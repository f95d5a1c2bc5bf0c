"""Guest side of the pingpong interop tests: run server/client pairs, one JSON line each.

Usage: pingpong_pairs.py CASES_JSON [PARALLEL], a list of {"name", "server": argv,
"client": argv}. The client is retried while the server is not listening yet (bounded),
the way tests/lab/test_lab_verbs.py does it with the real tools. Up to PARALLEL pairs
(default 1) run at once: the cases must then use distinct TCP ports; a line is printed
per case as it ends.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def run_pair(server: list[str], client: list[str], timeout: float) -> dict[str, object]:
    srv = subprocess.Popen(server, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    refused = ""
    cli = None
    for _ in range(300):
        cli = subprocess.run(client, capture_output=True, text=True, timeout=timeout)
        if cli.returncode == 0 or "connect" not in (cli.stderr + cli.stdout).lower():
            break
        refused = cli.stderr
        if srv.poll() is not None or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # the server is starting; only a retry bound, not synchronisation
    assert cli is not None
    # A client that failed leaves the server waiting for ever: give it a moment only.
    wait = deadline - time.monotonic() if cli.returncode == 0 else 10.0
    try:
        s_out, s_err = srv.communicate(timeout=max(5.0, wait))
    except subprocess.TimeoutExpired:
        srv.kill()
        s_out, s_err = srv.communicate()
    return {
        "server_rc": srv.returncode, "server_out": s_out, "server_err": s_err,
        "client_rc": cli.returncode, "client_out": cli.stdout,
        "client_err": cli.stderr or refused,
    }  # fmt: skip


def main() -> None:
    cases = json.loads(sys.argv[1])
    parallel = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    out = threading.Lock()

    def one(case: dict[str, object]) -> None:
        started = time.monotonic()
        result = run_pair(case["server"], case["client"], float(case.get("timeout", 120)))  # type: ignore[arg-type]
        result["name"] = case["name"]
        result["seconds"] = round(time.monotonic() - started, 2)
        with out:
            print(json.dumps(result), flush=True)

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for f in [pool.submit(one, case) for case in cases]:
            f.result()


if __name__ == "__main__":
    main()
