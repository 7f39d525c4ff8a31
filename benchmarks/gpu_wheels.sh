#!/usr/bin/env bash
# Fetch, here, the wheels naiad needs on the GPU device machine and its image lacks, into .whl/ at the repository's
# root (ignored by git through .git/info/exclude), for benchmarks/gpu_device_run.sh: cp312 manylinux, x86-64.
# The image has torch, numpy, uvloop, psutil, prometheus-client, ml-dtypes, nvidia-ml-py; grpcio and protobuf are
# carried too, so that grpcio-health-checking's generated code meets the versions it was generated for. About 11 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")" .whl
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  httptools==0.9.0 orjson==3.11.4 hpack==4.2.0 tritonclient==2.73.0 python-rapidjson==1.25 \
  grpcio==1.85.3 grpcio-health-checking==1.81.1 protobuf==6.33.6
du -sh .whl
