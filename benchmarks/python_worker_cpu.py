"""CPU per execution of the Python backend's worker, in one process: a ``Worker`` serving add_sub on a socket
pair, the server's end of the channel sending EXECUTE and reading DONE, the worker taking each message as its
run loop's common case does. No context switches, so it shows the worker's own Python work.

    python benchmarks/python_worker_cpu.py [TREE] [N] [time|prof]

``time``: µs of CPU per round trip (best of 5), and the server side's share (the same sends and receives around a
worker that does nothing). ``prof``: cProfile's table and the Python calls per round trip (both ends). TREE is the
naiad checkout to import (default: this one), so two trees can be compared A/B.
"""
import cProfile
import json
import pstats
import socket
import sys
import time
from pathlib import Path

import numpy as np

root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
sys.path.insert(0, str(root))
from naiad.backends.python import messages as M  # noqa: E402
from naiad.backends.python.shm import Arena  # noqa: E402
from naiad.backends.python.transport import Channel  # noqa: E402
from naiad.backends.python import worker as W  # noqa: E402

a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
sarena = Arena(1 << 20, 1 << 20); warena = Arena(1 << 20, 1 << 20)
server = Channel(a, sarena, blocking=True)
ch = Channel(b, warena, blocking=True)
model_dir = root / "examples/model_repository/add_sub"
cfg = {"name": "add_sub", "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]},
                                     {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [4]}]}
setup = {"instance_name": "add_sub_0", "decoupled": False, "output_names": ["OUTPUT0", "OUTPUT1"],
         "model_name": "add_sub", "model_version": 1, "model_file": str(model_dir / "1/model.py"),
         "args": {"model_config": json.dumps(cfg), "model_repository": str(model_dir), "model_version": "1"}}
w = W.Worker(ch, setup)
assert w.load(setup)
server.receive(wait=True)  # READY
x = np.arange(4, dtype=np.float32)
inputs = [server.pack("INPUT0", x), server.pack("INPUT1", x)]
routes = w._routes
def one(i):
    server.send(M.execute(i, [M.request(str(i), 0, 0, 0, {}, None, inputs)]))
    m = ch.receive(wait=True)[0]
    routes[m[0]](*m)
    done = server.receive(wait=True)
    return done
d = one(1)
assert d[0][2] is None and d[0][3][0][0] is None, d
N = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
mode = sys.argv[3] if len(sys.argv) > 3 else "time"
# worker-side-only cost: subtract server-side send+receive measured separately
def server_only(i):
    server.send(M.execute(i, [M.request(str(i), 0, 0, 0, {}, None, inputs)]))
    ch.sock.recv(65536)
    ch.send(M.done(i, None, [((None, [], {}))], 0, 0, 0, 0, None))
    server.receive(wait=True)
if mode == "prof":
    pr = cProfile.Profile(); pr.enable()
    for i in range(N): one(i)
    pr.disable()
    st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(80)
    print("calls per execution:", st.total_calls / N)
else:
    best_full = best_srv = 1e9
    for r in range(5):
        t = time.process_time()
        for i in range(N): one(i)
        best_full = min(best_full, (time.process_time() - t) / N * 1e6)
        t = time.process_time()
        for i in range(N): server_only(i)
        best_srv = min(best_srv, (time.process_time() - t) / N * 1e6)
    print(f"full {best_full:.2f} µs  server-side+raw {best_srv:.2f} µs  worker ~{best_full-best_srv:.2f} µs")
