#!/usr/bin/env bash
# GPU check (< 8 minutes on one CUDA GPU): the engine's equivalence tests on the device (incl. CUDA-graph
# decode vs eager: tests/engine/test_engine_graphs.py), then the engine benchmark (target-only / exact / pcg /
# transformers, batch 1 and 16) on a Llasa-1B-shaped random pair, eager and with CUDA graphs.
#
#   bench/gpu_check.sh [OUT_DIR]          results: OUT_DIR/{env.txt,tests.log,bench.log,engine.json}
#
# Environment: PYTHON (a python whose torch sees the GPU; default .venv/bin/python, then python3),
# DEVICE (cuda), SHAPE (llasa-1b; llasa-mini exercises the same path on a CPU), REPEATS (3).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/results/gpu_check}
DEVICE=${DEVICE:-cuda}
SHAPE=${SHAPE:-llasa-1b}
REPEATS=${REPEATS:-3}
mkdir -p "$OUT"

if [ -z "${PYTHON:-}" ]; then
  for candidate in .venv/bin/python python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "import torch" 2>/dev/null; then
      PYTHON=$candidate
      break
    fi
  done
fi
: "${PYTHON:?no python with torch found; set PYTHON}"

"$PYTHON" - "$DEVICE" <<'PY' | tee "$OUT/env.txt"
import importlib.util, sys
import torch
device = sys.argv[1]
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, device {device}")
if device.startswith("cuda"):
    if not torch.cuda.is_available():
        sys.exit("CUDA is not available to this torch; set PYTHON to a CUDA build")
    print(f"gpu {torch.cuda.get_device_name(0)}, cuda {torch.version.cuda}")
missing = [m for m in ("transformers", "safetensors", "scipy", "pytest", "tokenizers")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing packages: {' '.join(missing)} (pip install -e '.[test]')")
PY

set +e  # run the bench even if a test fails; the exit status reports both
start=$SECONDS
echo "== equivalence tests on $DEVICE"
PCGTTS_TEST_DEVICE=$DEVICE timeout 240 "$PYTHON" -m pytest -q -p no:cacheprovider \
  tests/engine/test_engine_model.py tests/engine/test_engine_greedy.py tests/engine/test_engine_sampling.py \
  tests/engine/test_engine_llasa.py tests/engine/test_engine_graphs.py tests/engine/test_engine_feature_head.py \
  2>&1 | tee "$OUT/tests.log"
tests_rc=${PIPESTATUS[0]}
echo "tests: exit $tests_rc after $((SECONDS - start)) s"

echo "== engine bench, shape $SHAPE on $DEVICE"
GRAPHS=eager
[[ $DEVICE == cuda* ]] && GRAPHS="eager cuda_graphs"
bench_rc=0
for graphs in $GRAPHS; do
  mkdir -p "$OUT/$graphs"
  timeout 165 "$PYTHON" -m pcgtts.bench.engine_bench --shape "$SHAPE" --device "$DEVICE" --batch-sizes 1 16 \
    --max-tokens 128 --prompt-len 64 --repeats "$REPEATS" --decode-graphs "$graphs" --out "$OUT/$graphs" \
    2>&1 | tee "$OUT/$graphs/bench.log"
  (( PIPESTATUS[0] != 0 )) && bench_rc=1
done
echo "bench: exit $bench_rc; total $((SECONDS - start)) s"
exit $(( tests_rc != 0 || bench_rc != 0 ))
