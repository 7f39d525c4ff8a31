"""kill -9 of a Python model's worker, again and again, under load on it and on two bystanders (a Python model
in its own worker and an ONNX model).

    timeout 600 python benchmarks/reliability/worker_kill.py --kills 10 --interval 2

Prints, for each kill, how long until the victim answered from a new worker; then per model the requests sent,
failed (with the distinct error messages) and unanswered at the client's timeout, and the latency percentiles.
Exit status 1 if a bystander failed, the victim did not recover, or any request went unanswered.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.reliability import procs  # noqa: E402
from tests.reliability.load import Load, fp32_body, infer_once, percentile  # noqa: E402
from tests.reliability.repo import write_echo_pid, write_onnx_add_sub  # noqa: E402
from tests.server import RunningServer  # noqa: E402


def victim_pid(port: int, timeout: float) -> int | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        status, doc = infer_once(conn, "victim", fp32_body([1.0]))
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        conn.close()
    if status != 200:
        return None
    return int({o["name"]: o["data"] for o in doc["outputs"]}["PID"][0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--interval", type=float, default=2.0,
                        help="seconds of load between a recovery and the next kill")
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=10.0, help="the clients' per-request timeout")
    args = parser.parse_args()
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        write_echo_pid(repo, "victim")
        write_echo_pid(repo, "bystander")
        write_onnx_add_sub(repo, "onnx")
        server = RunningServer([repo])
        onnx_body = json.dumps({"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
                                           for n in ("INPUT0", "INPUT1")]}).encode()
        try:
            load = Load(server.http_port, ["victim", "bystander"], args.clients, args.timeout).start()
            onnx = Load(server.http_port, ["onnx"], 1, args.timeout, body=lambda n: onnx_body).start()
            recoveries = []
            for kill in range(args.kills):
                time.sleep(args.interval)
                pid = victim_pid(server.http_port, args.timeout)
                if pid is None:
                    print(f"kill {kill + 1}: the victim is not answering before the kill")
                    failed = True
                    break
                killed = time.monotonic()
                os.kill(pid, signal.SIGKILL)
                new = pid
                while (new is None or new == pid) and time.monotonic() - killed < 30:
                    time.sleep(0.02)
                    new = victim_pid(server.http_port, args.timeout)
                took = time.monotonic() - killed
                recoveries.append(took)
                print(f"kill {kill + 1}: pid {pid} -> {new} in {took:.2f} s", flush=True)
                if new is None or new == pid:
                    failed = True
                    break
            time.sleep(args.interval)
            results = load.stop() + onnx.stop()
            print(f"\nrecovery s: median {percentile(recoveries, .5):.2f}  max {max(recoveries):.2f}")
            by_model = collections.defaultdict(list)
            for r in results:
                by_model[r.model].append(r)
            for model, items in sorted(by_model.items()):
                bad = [r for r in items if r.status != 200]
                lost = [r for r in items if r.status is None]
                latencies = [r.seconds * 1000 for r in items]
                print(f"{model:>10}: {len(items)} requests, {len(bad)} failed, {len(lost)} unanswered; latency ms "
                      f"p50 {percentile(latencies, .5):.1f} p99 {percentile(latencies, .99):.1f} "
                      f"max {max(latencies):.1f}")
                for (status, error), n in collections.Counter((r.status, (r.error or "")[:150]) for r in bad).items():
                    print(f"{'':>12}{n} x {status}: {error}")
                failed |= bool(lost) or (model != "victim" and bool(bad))
            after = procs.snapshot(server.proc.pid)
            zombies = procs.zombies(server.proc.pid)
            print(f"\nserver tree after: {after.describe()}; zombies: {zombies or 'none'}")
            failed |= bool(zombies)
        finally:
            server.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
