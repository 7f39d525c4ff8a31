"""Seeded HTTP, gRPC, model-control and SageMaker fuzzing at length (thousands of cases; tests/reliability runs a
few hundred in CI).

    timeout 900 python benchmarks/reliability/fuzz.py --cases 5000 --seed 1
    python benchmarks/reliability/fuzz.py --protocol grpc --engines lean,grpcio --cases 3000 --seed 2
    python benchmarks/reliability/fuzz.py --protocol control --cases 1000 --batch 25

Prints, per protocol (and gRPC engine), how many cases ran, their answers by status, the slowest answer, each
problem the oracle found (the case that shows it, to replay), and the health checks that failed between batches.
Exit status 1 if anything was found. ``--pause`` sleeps between batches, to share the CPU.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.models import IDENTITY_FP32, IDENTITY_PY, write_model  # noqa: E402
from tests.reliability import fuzz_control, fuzz_grpc, fuzz_http, fuzz_sagemaker, http_oracle  # noqa: E402
from tests.reliability.fuzz_control import TARGET  # noqa: E402
from tests.reliability.repo import FUZZ_SERVER_FLAGS, write_fuzz_models  # noqa: E402
from tests.server import RunningServer  # noqa: E402


def report(title: str, outcomes: list, health: list[str], seconds: float, answer: callable, show: int) -> int:
    answers = collections.Counter(answer(o) for o in outcomes)
    kinds = collections.Counter(o.case.kind for o in outcomes)
    problems = [o for o in outcomes if o.problem]
    slowest = max(outcomes, key=lambda o: o.seconds) if outcomes else None
    print(f"\n== {title}: {len(outcomes)} cases in {seconds:.1f} s ({len(outcomes) / max(seconds, 1e-9):.0f}/s)")
    print("   answers: " + ", ".join(f"{k}: {v}" for k, v in sorted(answers.items(), key=lambda kv: -kv[1])))
    print("   kinds:   " + ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items())))
    if slowest is not None:
        print(f"   slowest: {slowest.seconds:.2f} s {slowest.case.describe()[:160]}")
    print(f"   problems: {len(problems)}; health failures: {len(health)}")
    grouped = collections.defaultdict(list)
    for o in problems:
        grouped[(o.case.kind, o.problem[:90])].append(o)
    for (kind, problem), items in sorted(grouped.items(), key=lambda kv: -len(kv[1])):
        print(f"   {len(items):5d} x [{kind}] {problem}")
        for o in items[:show]:
            print(f"           e.g. {o.case.describe()[:400]}")
    for line in health:
        print(f"   HEALTH {line}")
    return len(problems) + len(health)


def fuzz(args: argparse.Namespace, server: RunningServer, protocol: str, engine: str,
         models_root: Path | None = None) -> int:
    """Run the cases in batches (a health check after each, then ``--pause``); report; the number of findings.
    ``engine``: the gRPC engine, or the SageMaker endpoint kind."""
    if protocol == "sagemaker":
        cases = fuzz_sagemaker.generate(args.seed, args.cases, models_root)
    else:
        cases = {"http": fuzz_http, "grpc": fuzz_grpc, "control": fuzz_control}[protocol].generate(args.seed,
                                                                                                    args.cases)
    alive = lambda: server.proc.poll() is None  # noqa: E731
    started = time.monotonic()
    outcomes: list = []
    health: list[str] = []
    for start in range(0, len(cases), args.batch):
        batch = cases[start : start + args.batch]
        if protocol == "http":
            o, h = http_oracle.run("127.0.0.1", server.http_port, batch, batch=args.batch, alive=alive,
                                 parallel=args.parallel)
        elif protocol == "sagemaker":
            root = models_root
            invoke = "/invocations" if root is None else f"/models/{fuzz_sagemaker.MME_KEY}/invoke"
            o, h = fuzz_sagemaker.run(
                "127.0.0.1", server.sagemaker_port, batch, invoke, batch=args.batch, alive=alive,
                between=(lambda: None) if root is None else
                (lambda: fuzz_sagemaker.mme_reset("127.0.0.1", server.sagemaker_port, root)))
        elif protocol == "control":
            o, h = fuzz_control.run("127.0.0.1", server.http_port, batch, batch=args.batch, alive=alive)
        else:
            o, h = fuzz_grpc.run(server.grpc_url, batch, batch=args.batch, alive=alive, parallel=args.parallel)
        outcomes += o
        health += [f"batch from case {start}: {line}" for line in h]
        if not alive():
            break
        time.sleep(args.pause)
    title = {"http": "HTTP", "grpc": f"gRPC {engine}", "control": "model control (explicit mode, HTTP)",
             "sagemaker": f"SageMaker {engine}"}[protocol]
    answer = (lambda o: o.code.name if o.code else None) if protocol == "grpc" else (lambda o: o.status)
    return report(f"{title} (seed {args.seed})", outcomes, health, time.monotonic() - started, answer, args.show)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=5000, help="per protocol and engine")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--protocol", default="http,grpc,control,sagemaker",
                        help="comma-separated: http, grpc (each engine of --engines), control (explicit-mode loads), "
                             "sagemaker (single- and multi-model endpoints)")
    parser.add_argument("--engines", default="lean,grpcio", help="gRPC engines to fuzz, comma-separated")
    parser.add_argument("--batch", type=int, default=100, help="cases between health checks")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds to sleep after each batch")
    parser.add_argument("--parallel", type=int, default=1,
                        help="HTTP and gRPC: connections sending each batch at once (cases meet in the server)")
    parser.add_argument("--show", type=int, default=2, help="examples shown per kind of problem")
    args = parser.parse_args()
    protocols = args.protocol.split(",")
    found = 0
    with tempfile.TemporaryDirectory() as tmp:
        write_fuzz_models(Path(tmp))
        engines = args.engines.split(",") if "grpc" in protocols else ["lean"]
        for i, engine in enumerate(engines):
            server = RunningServer([Path(tmp)], *FUZZ_SERVER_FLAGS, "--grpc-engine", engine)
            try:
                with http_oracle.registered_region("127.0.0.1", server.http_port):
                    if "http" in protocols and i == 0:
                        found += fuzz(args, server, "http", "")
                    if "grpc" in protocols:
                        found += fuzz(args, server, "grpc", engine)
            finally:
                if server.proc.poll() is not None:
                    print(f"   the server exited with {server.proc.returncode}; log tail:\n{server.log()[-3000:]}")
                server.stop()
    if "sagemaker" in protocols:
        with tempfile.TemporaryDirectory() as tmp:
            base = Path(tmp)
            write_fuzz_models(base / "repo")
            server = RunningServer([base / "repo"], "--allow-sagemaker=true", "--allow-grpc=false",
                                   env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": fuzz_sagemaker.DEFAULT_MODEL})
            try:
                found += fuzz(args, server, "sagemaker", "single-model")
            finally:
                server.stop()
            root = base / "root"
            fuzz_sagemaker.write_mme_model(root)
            (base / "empty").mkdir()
            server = RunningServer([base / "empty"], "--allow-sagemaker=true", "--allow-grpc=false",
                                   "--model-control-mode=explicit", f"--sagemaker-models-root={root}",
                                   env={"SAGEMAKER_MULTI_MODEL": "true"})
            try:
                fuzz_sagemaker.mme_reset("127.0.0.1", server.sagemaker_port, root)
                found += fuzz(args, server, "sagemaker", "multi-model", root)
            finally:
                server.stop()
    if "control" in protocols:
        with tempfile.TemporaryDirectory() as tmp:
            write_model(Path(tmp), TARGET, IDENTITY_FP32.format(name=TARGET), IDENTITY_PY)
            server = RunningServer([Path(tmp)], "--model-control-mode=explicit", f"--load-model={TARGET}")
            try:
                found += fuzz(args, server, "control", "")
            finally:
                if server.proc.poll() is not None:
                    print(f"   the server exited with {server.proc.returncode}; log tail:\n{server.log()[-3000:]}")
                server.stop()
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
