#!/usr/bin/env bash
# GPU check (meant to fit 10 minutes on one CUDA GPU; not yet run on one): the engine's equivalence tests on
# the device (incl. CUDA-graph decode vs eager: tests/engine/test_engine_graphs.py) and, where vLLM is
# installed, the vLLM plugin's (tests/vllm: verdicts, distributions through vLLM), then both engines on a
# Llasa-1B-shaped random pair at batch 1, 8, 32, 64: our engine (target-only / exact / pcg, eager and with
# CUDA graphs) and vLLM with pcgtts' plugin (target-only / exact / pcg, CUDA graphs, one round) in one
# `bench engine` table: which engine is faster at each batch size, and whether PCG pays on each; then the
# draft-length / token-tree sweep of bench/results/tree/ on the shipped bundle, and the draft length chosen
# per batch size (bench/results/spec-lengths/).
#
#   bench/gpu_check.sh [OUT_DIR]   results: OUT_DIR/{env.txt,tests.log,eager/,cuda_graphs/,tree/,spec-lengths/}
#
# Environment: PYTHON (a python whose torch sees the GPU, with vLLM 0.32 for vLLM's rows: README "GPU";
# default .venv/bin/python, then python3), DEVICE (cuda), SHAPE (llasa-1b; llasa-mini exercises the same
# path on a CPU), REPEATS (3), BATCHES ("1 8 32 64"), BENCH_TIMEOUT (s per bench run, 300).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/results/gpu_check}
DEVICE=${DEVICE:-cuda}
SHAPE=${SHAPE:-llasa-1b}
REPEATS=${REPEATS:-3}
BATCHES=${BATCHES:-1 8 32 64}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-300}
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
try:
    from pcgtts.engine.vllm.versions import check_vllm
    print("vllm: %s %s" % check_vllm())
except Exception as exc:  # the bench reports vLLM's rows as skipped, with this reason
    print(f"vllm: none ({exc})")
PY
VLLM_TESTS=()
grep -q "^vllm: none" "$OUT/env.txt" || VLLM_TESTS=(tests/vllm/test_vllm_verify.py tests/vllm/test_vllm_distribution.py)

set +e  # run the bench even if a test fails; the exit status reports both
start=$SECONDS
echo "== equivalence tests on $DEVICE"
PCGTTS_TEST_DEVICE=$DEVICE timeout 240 "$PYTHON" -m pytest -q -p no:cacheprovider \
  tests/engine/test_engine_model.py tests/engine/test_engine_greedy.py tests/engine/test_engine_sampling.py \
  tests/engine/test_engine_llasa.py tests/engine/test_engine_graphs.py tests/engine/test_engine_feature_head.py \
  tests/engine/test_tree_forward.py tests/engine/test_engine_tree.py \
  "${VLLM_TESTS[@]}" 2>&1 | tee "$OUT/tests.log"
tests_rc=${PIPESTATUS[0]}
echo "tests: exit $tests_rc after $((SECONDS - start)) s"

echo "== engine bench, shape $SHAPE on $DEVICE, batch $BATCHES"
GRAPHS=eager
[[ $DEVICE == cuda* ]] && GRAPHS="eager cuda_graphs"
LAST=${GRAPHS##* }
bench_rc=0
for graphs in $GRAPHS; do
  mkdir -p "$OUT/$graphs"
  # vLLM's rows (one round, before ours) in the last run only: its start-ups dominate the time box
  VLLM_ROUNDS=0
  [ "$graphs" = "$LAST" ] && VLLM_ROUNDS=1
  # shellcheck disable=SC2086  # BATCHES is a list of numbers
  timeout "$BENCH_TIMEOUT" "$PYTHON" -m pcgtts.bench.engine_bench --shape "$SHAPE" --device "$DEVICE" \
    --batch-sizes $BATCHES --max-tokens 128 --prompt-len 64 --repeats "$REPEATS" --decode-graphs "$graphs" \
    --no-hf-assisted --vllm-python "$PYTHON" --vllm-rounds "$VLLM_ROUNDS" --out "$OUT/$graphs" \
    2>&1 | tee "$OUT/$graphs/bench.log"
  (( PIPESTATUS[0] != 0 )) && bench_rc=1
done
# the CPU's draft-length / token-tree sweep (bench/results/tree/) on the device, the shipped bundle: whether
# a tree (k = 2), which costs more verify compute than it gains on the CPU, pays where a verify forward of a
# few dozen tokens costs about one token's; and the confidence-following length (γ 6, θ 0.37: 3.5 tokens per
# verify step on the CPU, slower there than a fixed γ: bench/results/ragged-verify/)
mkdir -p "$OUT/tree"
timeout "$BENCH_TIMEOUT" "$PYTHON" -m pcgtts.cli bench draft-length --device "$DEVICE" --rules exact pcg \
  --settings 3:0 3:0:2 5:0 5:0:2 6:0.37 --batch-sizes 1 6 --utterances 6 --repeats "$REPEATS" --max-tokens 300 \
  --out "$OUT/tree" 2>&1 | tee "$OUT/tree/bench.log"
(( PIPESTATUS[0] != 0 )) && bench_rc=1
# the draft length chosen per batch size (bench/results/spec-lengths/): the auto policy with γ 3 alone
# against γ 3 or 5, unseeded, from one stream to many (on the CPU it gained only at batch 1)
mkdir -p "$OUT/spec-lengths"
timeout "$BENCH_TIMEOUT" "$PYTHON" -m pcgtts.cli bench draft-length --device "$DEVICE" --speculation auto \
  --rules pcg --settings 3:0 3+5:0 --batch-sizes 1 4 16 --utterances 16 --repeats "$REPEATS" --max-tokens 200 \
  --out "$OUT/spec-lengths" 2>&1 | tee "$OUT/spec-lengths/bench.log"
(( PIPESTATUS[0] != 0 )) && bench_rc=1
echo "bench: exit $bench_rc; total $((SECONDS - start)) s"
exit $(( tests_rc != 0 || bench_rc != 0 ))
