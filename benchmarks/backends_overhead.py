#!/usr/bin/env python3
"""Per-request overhead of naiad's onnxruntime and pytorch backends over calling the framework directly.

For each model and backend, two runs side by side, each one process pinned to the same core (`--server-cpu`):

* direct: a Python process loads the model with the framework (onnxruntime.InferenceSession, torch.jit.load)
  and calls it in a loop with the same tensors: calls/s and mean microseconds per call;
* naiad: `naiad serve` with the same model file, loaded by wrk (pinned to `--wrk-cpu`) with a KServe v2 JSON
  request carrying those tensors: req/s and latency at each connection level.

Both sides use one intra-op thread (the core is one core) and one model instance, so the difference is what
serving adds: HTTP, JSON, request checks, scheduling and the hop to the instance's thread (or not: fast models
run inline). The overhead column is the time one request takes at one connection (1 / req/s, wrk's own time
included) minus the direct call time; the ratio is naiad's req/s at the most connections over direct calls/s.

Models: `add_sub` (FP32 [16] sum and difference, built here, cost dominated by overhead) and, when exported
(tools/export_minilm.py, `--minilm REPO`), MiniLM with 16 tokens (cost dominated by compute).

    flock /tmp/naiad-bench.lock python3 benchmarks/backends_overhead.py --duration 5

Stdlib + the frameworks; external tools: wrk, taskset.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
PROJECT_DIR = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(PROJECT_DIR))

from http_add_sub import Server, free_port, start, stop, wait_ready

WRK_DONE = """
done = function(summary, latency, requests)
  io.write(string.format('WRK_JSON {"requests":%d,"duration_us":%d,"errors":%d,"mean":%.1f,"p50":%d,"p99":%d}\\n',
    summary.requests, summary.duration, summary.errors.status + summary.errors.read + summary.errors.connect
    + summary.errors.timeout, latency.mean, latency:percentile(50), latency:percentile(99)))
end
"""

DIRECT = {
    "onnxruntime": """
        import json, sys, time
        import numpy as np, onnxruntime as ort
        path, feed, seconds = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
        options = ort.SessionOptions(); options.intra_op_num_threads = 1; options.inter_op_num_threads = 1
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        feed = {k: np.array(v["data"], dtype=v["dtype"]).reshape(v["shape"]) for k, v in feed.items()}
        call = lambda: session.run(None, feed)
    """,
    "pytorch": """
        import json, sys, time
        import numpy as np, torch
        path, feed, seconds = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
        torch.set_num_threads(1)
        module = torch.jit.load(path).eval()
        args = [torch.from_numpy(np.array(v["data"], dtype=v["dtype"]).reshape(v["shape"])) for v in feed.values()]
        def call():
            with torch.inference_mode():
                return module(*args)
    """,
}
DIRECT_LOOP = """
    for _ in range(200):
        call()
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(50):
            call()
        n += 50
    elapsed = time.perf_counter() - started
    print(json.dumps({"calls": n, "seconds": elapsed}))
"""

THREADS = {
    "onnxruntime": 'parameters [{ key: "intra_op_thread_count" value: { string_value: "1" } },'
                   ' { key: "inter_op_thread_count" value: { string_value: "1" } }]',
    "pytorch": 'parameters [{ key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } },'
               ' { key: "INTER_OP_THREAD_COUNT" value: { string_value: "1" } }]',
}


@dataclass
class Case:
    model: str
    backend: str
    file: Path  # model.onnx / model.pt
    config: str  # config.pbtxt without parameters/instances
    feed: dict  # input name -> {"data", "dtype", "shape", "wire"}


def add_sub_cases(workdir: Path) -> list[Case]:
    import onnx
    import torch
    from onnx import TensorProto, helper

    io = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 16])
    graph = helper.make_graph([helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
                               helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])], "add_sub",
                              [io("INPUT0"), io("INPUT1")], [io("OUTPUT0"), io("OUTPUT1")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    onnx_path = workdir / "add_sub.onnx"
    onnx.save(proto, str(onnx_path))
    script = workdir / "add_sub_module.py"
    script.write_text(textwrap.dedent("""
        import torch
        class AddSub(torch.nn.Module):
            def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor):
                return INPUT0 + INPUT1, INPUT0 - INPUT1
    """))
    sys.path.insert(0, str(workdir))
    from add_sub_module import AddSub  # type: ignore[import-not-found]

    pt_path = workdir / "add_sub.pt"
    torch.jit.save(torch.jit.script(AddSub()), str(pt_path))
    feed = {n: {"data": [float(i) for i in range(16)], "dtype": "float32", "shape": [1, 16], "wire": "FP32"}
            for n in ("INPUT0", "INPUT1")}
    ios = ('input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 16 ] }, '
           '{ name: "INPUT1", data_type: TYPE_FP32, dims: [ 16 ] }]\n'
           'output [{ name: "%s", data_type: TYPE_FP32, dims: [ 16 ] }, { name: "%s", data_type: TYPE_FP32, dims: [ 16 ] }]')
    return [
        Case("add_sub", "onnxruntime", onnx_path, 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
             + ios % ("OUTPUT0", "OUTPUT1"), feed),
        Case("add_sub", "pytorch", pt_path, 'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
             + ios % ("OUTPUT__0", "OUTPUT__1"), feed),
    ]


def minilm_cases(repo: Path) -> list[Case]:
    ids = [101, 1037, 2158, 2003, 5983, 1037, 3538, 1997, 7852, 1999, 1996, 3871, 2114, 1996, 2154, 102]
    feed = {"input_ids": {"data": ids, "dtype": "int64", "shape": [1, 16], "wire": "INT64"},
            "attention_mask": {"data": [1] * 16, "dtype": "int64", "shape": [1, 16], "wire": "INT64"}}
    cases = []
    for backend, model, filename in (("onnxruntime", "minilm_onnx", "model.onnx"), ("pytorch", "minilm_torch", "model.pt")):
        config = (repo / model / "config.pbtxt").read_text()
        config = "\n".join(l for l in config.splitlines() if not l.startswith(("name:", "instance_group")))
        cases.append(Case("minilm", backend, repo / model / "1" / filename, config, feed))
    return cases


def run_direct(case: Case, cpu: int, seconds: float) -> dict:
    code = textwrap.dedent(DIRECT[case.backend]) + textwrap.dedent(DIRECT_LOOP)
    argv = ["taskset", "-c", str(cpu), sys.executable, "-c", code, str(case.file), json.dumps(case.feed), str(seconds)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=seconds + 120).stdout
    raw = json.loads(out.strip().splitlines()[-1])
    return {"calls_per_s": raw["calls"] / raw["seconds"], "us_per_call": raw["seconds"] / raw["calls"] * 1e6}


def write_repo(case: Case, root: Path) -> Path:
    repo = root / f"repo_{case.model}_{case.backend}"
    folder = repo / "m" / "1"
    folder.mkdir(parents=True)
    (folder / ("model.onnx" if case.backend == "onnxruntime" else "model.pt")).symlink_to(case.file)
    (repo / "m" / "config.pbtxt").write_text(
        f'name: "m"\n{case.config}\n{THREADS[case.backend]}\ninstance_group [{{ count: 1, kind: KIND_CPU }}]\n')
    return repo


def wrk_script(case: Case, path: Path) -> None:
    body = json.dumps({"inputs": [{"name": n, "shape": v["shape"], "datatype": v["wire"], "data": v["data"]}
                                  for n, v in case.feed.items()]})
    path.write_text('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                    f"wrk.body = '{body}'\n" + WRK_DONE)


def run_wrk(url: str, script: Path, connections: int, seconds: int, cpu: int) -> dict:
    argv = ["taskset", "-c", str(cpu), "wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s",
            "-s", str(script), url]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    line = next(l for l in out.splitlines() if l.startswith("WRK_JSON "))
    raw = json.loads(line[len("WRK_JSON "):])
    return {"rps": raw["requests"] / (raw["duration_us"] / 1e6), "mean_us": raw["mean"], "p99_us": raw["p99"],
            "errors": raw["errors"]}


def run_naiad(case: Case, workdir: Path, args: argparse.Namespace) -> dict[int, dict]:
    repo = write_repo(case, workdir)
    script = workdir / f"{case.model}_{case.backend}.lua"
    wrk_script(case, script)
    port = free_port()
    server = Server("naiad", [sys.executable, "-m", "naiad", "serve", "--model-repository", str(repo),
                              "--http-port", str(port), "--log-info=false"], port, PROJECT_DIR,
                    {"PYTHONPATH": str(PROJECT_DIR)})
    proc = start(server, args.server_cpu, workdir / f"naiad_{case.model}_{case.backend}.log")
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, proc, 60)
        url = base + "/v2/models/m/infer"
        run_wrk(url, script, max(args.connections), 2, args.wrk_cpu)  # warm-up
        return {c: run_wrk(url, script, c, args.duration, args.wrk_cpu) for c in args.connections}
    finally:
        stop(proc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=5, help="seconds per measurement")
    parser.add_argument("--connections", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    parser.add_argument("--server-cpu", type=int, default=1)
    parser.add_argument("--wrk-cpu", type=int, default=0)
    parser.add_argument("--minilm", type=Path, default=PROJECT_DIR / "examples" / "minilm_repository",
                        help="an exported MiniLM repository (skipped if its model files are missing)")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)

    rows = []
    with tempfile.TemporaryDirectory(prefix="naiad-backends-") as tmp:
        workdir = Path(tmp)
        cases = add_sub_cases(workdir)
        if (args.minilm / "minilm_onnx" / "1" / "model.onnx").exists():
            cases += minilm_cases(args.minilm)
        else:
            print(f"MiniLM not exported under {args.minilm}; run tools/export_minilm.py to include it", file=sys.stderr)
        for case in cases:
            print(f"[{case.model}/{case.backend}] direct ...", file=sys.stderr)
            direct = run_direct(case, args.server_cpu, args.duration)
            print(f"[{case.model}/{case.backend}] naiad ...", file=sys.stderr)
            served = run_naiad(case, workdir, args)
            rows.append({"model": case.model, "backend": case.backend, "direct": direct, "naiad": served})

    print(f"{'model':8} {'backend':12} {'direct us':>10} {'direct/s':>9} "
          + " ".join(f"{'naiad c=' + str(c) + ' /s':>14} {'mean us':>8}" for c in args.connections)
          + f" {'overhead us':>12} {'ratio c=' + str(max(args.connections)):>11}")
    for row in rows:
        d, n = row["direct"], row["naiad"]
        cols = " ".join(f"{n[c]['rps']:>14.0f} {n[c]['mean_us']:>8.0f}" for c in args.connections)
        # At one connection requests follow each other, so 1/rps is the time one request takes end to end.
        overhead = 1e6 / n[min(args.connections)]["rps"] - d["us_per_call"]
        ratio = n[max(args.connections)]["rps"] / d["calls_per_s"]
        print(f"{row['model']:8} {row['backend']:12} {d['us_per_call']:>10.1f} {d['calls_per_s']:>9.0f} {cols} "
              f"{overhead:>12.0f} {ratio:>10.2f}x")
        if any(v["errors"] for v in n.values()):
            print(f"  errors during the naiad run: {[v['errors'] for v in n.values()]}")
    if args.json_out:
        args.json_out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
