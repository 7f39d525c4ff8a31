#!/usr/bin/env bash
# The device machine's one call for benchmarks/gpu.py, about 7 minutes on a 16-core host with one H100 or H200:
#
#   bash benchmarks/gpu_wheels.sh      # here, once: the wheels naiad needs there, into .whl/
#   run(command="bash benchmarks/gpu_device_run.sh", carry=[".whl"], timeout_s=480)
#
# Checks torch and CUDA, installs the carried wheels (if any) into /tmp/site, checks that naiad imports, then runs
# gpu.py with --deadline (no new server or level after it; NAIAD_GPU_BUDGET_S, default 330 s;
# gpu.py is stopped at that plus 90 s, and prints what it measured) and writes, under
# $OUT: env.txt (nvidia-smi, versions), gpu.log (progress and the table), gpu.json (every figure) and logs.tar.gz
# (server and naiad bench logs). Arguments go to gpu.py after these defaults, so they win (e.g. --instances 2).
# A rehearsal on a CPU host: NAIAD_GPU_ALLOW_CPU=1 OUT=/tmp/o bash benchmarks/gpu_device_run.sh --device cpu --small
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/naiad-gpu-out}"
mkdir -p "$OUT"
BUDGET="${NAIAD_GPU_BUDGET_S:-330}"
export PYTHONUNBUFFERED=1
{
  date -u; echo "cores: $(nproc)"; nvidia-smi; python3 -V
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
} > "$OUT/env.txt" 2>&1
if compgen -G ".whl/*.whl" > /dev/null; then
  if ! python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl >> "$OUT/env.txt" 2>&1; then
    echo "installing the carried wheels failed:"; tail -20 "$OUT/env.txt"; exit 1
  fi
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! python3 -c "import torch, grpc, google.protobuf, httptools, orjson, hpack, rapidjson, tritonclient.grpc, \
grpc_health.v1.health_pb2, naiad.server, naiad.bench.cli, os; \
assert torch.cuda.is_available() or os.environ.get('NAIAD_GPU_ALLOW_CPU'), 'torch sees no GPU'; \
print('imports ok; grpcio', grpc.__version__, 'protobuf', google.protobuf.__version__)" >> "$OUT/env.txt" 2>&1; then
  echo "naiad or CUDA is not usable here (carry the wheels of benchmarks/gpu_wheels.sh):"; tail -25 "$OUT/env.txt"
  exit 1
fi
rm -rf /tmp/naiad-gpu
timeout -k 40 $((BUDGET + 90)) python3 benchmarks/gpu.py --workdir /tmp/naiad-gpu --json-out "$OUT/gpu.json" \
  --deadline "$BUDGET" --frontend-processes 1,4 --limit-seconds 1.0 --bench-seconds 1.5 "$@" 2>&1 | tee "$OUT/gpu.log"
rc=$?
tar -C /tmp/naiad-gpu --exclude='*.pt' -czf "$OUT/logs.tar.gz" . 2> /dev/null
tail -3 "$OUT/env.txt"
exit $rc
