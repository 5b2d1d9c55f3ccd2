#!/usr/bin/env bash
# Run-book for the real thing on one CUDA GPU (minutes): Llasa-1B as target with a smaller draft, its ASG
# table (`pcgtts asg build`), the acceptance sweep (target-only / exact / SSD / top-k / LANTERN / PCG side
# by side) and `pcgtts serve` smoke tests on both engines (the built-in one, then `--engine vllm` with the
# plugin's PCG where vLLM is installed: voice upload through X-codec2's encoder, streamed speech, the
# acceptance counters of /metrics). Which engine is faster at batch 1-64: bench/gpu_check.sh.
#
#   LLASA=DIR XCODEC2=DIR [SEMANTIC=DIR] [DRAFT=DIR] bench/llasa_gpu.sh [OUT_DIR]
#
# Local directories, downloaded beforehand (see the README, "Serve a real Llasa checkpoint"):
#   LLASA     HKUSTAudio/Llasa-1B         XCODEC2   HKUSTAudio/xcodec2
#   SEMANTIC  facebook/w2v-bert-2.0 (default: the Hugging Face cache; without it the codec decodes only)
#   DRAFT     a draft checkpoint (default: the target's first DRAFT_LAYERS=3 layers, untrained)
# Each one absent is replaced by random weights of the real shape and the run says so (then the numbers
# measure the machinery, not the model). Nothing is downloaded: HF_HUB_OFFLINE=1.
# Environment: PYTHON (default .venv/bin/python), DEVICE (cuda), THETA (ASG θ, 0.40), SHAPE (random
# target's shape: llasa-1b; llasa-mini for a CPU dry run), REDUCED_CODEC=1 (random codec at test sizes),
# ASR=1 (WER with Whisper tiny.en: needs the `eval` extra), MAX_TOKENS (speech tokens per utterance, 400),
# PORT (8765).
# Results: OUT_DIR/{prepare.log,asg.log,sweep/acceptance.json,sweep.log,serve-builtin/,serve-vllm/}.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/results/llasa_gpu}
DEVICE=${DEVICE:-cuda}
THETA=${THETA:-0.40}
PORT=${PORT:-8765}
MAX_TOKENS=${MAX_TOKENS:-400}
PYTHON=${PYTHON:-.venv/bin/python}
export HF_HUB_OFFLINE=1
mkdir -p "$OUT"
start=$SECONDS

"$PYTHON" -c "import xcodec2" 2>/dev/null || { echo "the xcodec2 extra is missing: make install-xcodec2"; exit 1; }
if [ "${DEVICE%%:*}" = cuda ]; then
  "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'CUDA is not available to this torch; set PYTHON')"
fi

echo "== local directories"
"$PYTHON" -m pcgtts.bench.llasa_runbook --out "$OUT" --device "$DEVICE" --draft-layers "${DRAFT_LAYERS:-3}" \
  --shape "${SHAPE:-llasa-1b}" ${REDUCED_CODEC:+--reduced-codec} ${LLASA:+--target "$LLASA"} \
  ${DRAFT:+--draft "$DRAFT"} ${XCODEC2:+--codec "$XCODEC2"} ${SEMANTIC:+--semantic "$SEMANTIC"} \
  2>&1 | tee "$OUT/prepare.log"
# shellcheck source=/dev/null
source "$OUT/setup.env"

echo "== ASG table, θ=$THETA ($((SECONDS - start)) s)"
"$PYTHON" -m pcgtts.cli asg build --model "$TARGET" --theta "$THETA" --out "$OUT/asg.safetensors" \
  --device "$DEVICE" 2>&1 | tee "$OUT/asg.log"

echo "== acceptance sweep ($((SECONDS - start)) s)"
set +e
"$PYTHON" -m pcgtts.cli bench acceptance --model "$OUT/bundle" --device "$DEVICE" --out "$OUT/sweep" --quick \
  --max-tokens "$MAX_TOKENS" $([ -n "${ASR:-}" ] || echo --no-asr) 2>&1 | tee "$OUT/sweep.log"
sweep_rc=${PIPESTATUS[0]}

# `pcgtts serve --engine ENGINE`: ready, a voice upload (X-codec2's encoder), one streamed utterance in it
smoke() {
  local engine=$1 dir="$OUT/serve-$1" rc=1 voice=alloy code
  mkdir -p "$dir"
  echo "== serve smoke test, engine $engine ($((SECONDS - start)) s)"
  "$PYTHON" -m pcgtts.cli serve --engine "$engine" --model "$TARGET" --draft "$DRAFT" --codec "$CODEC" \
    ${SEMANTIC:+--semantic-model "$SEMANTIC"} --asg-table "$OUT/asg.safetensors" --device "$DEVICE" \
    --port "$PORT" --data-dir "$dir/data" --max-tokens "$MAX_TOKENS" >"$dir/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 600); do
    if curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null; then rc=0; break; fi
    kill -0 $server 2>/dev/null || break
    curl -s "http://127.0.0.1:$PORT/ready" | grep -q '"failed"' && break  # the model failed to load
    sleep 1
  done
  if [ $rc = 0 ]; then
    code=$(curl -s -o "$dir/upload.json" -w '%{http_code}' "http://127.0.0.1:$PORT/v1/audio/voices" \
      -F name=ref -F transcript="A short reference clip." -F audio_sample=@"$OUT/ref.wav")
    echo "voice upload: HTTP $code $(cat "$dir/upload.json")"
    [ "$code" = 201 ] && voice=ref
    [ "$voice" = ref ] || echo "(no voice: a Llasa checkpoint has no presets, so the request below fails)"
    curl -sf -o "$dir/smoke.wav" "http://127.0.0.1:$PORT/v1/audio/speech" -H 'Content-Type: application/json' \
      -d "{\"model\": \"llasa\", \"voice\": \"$voice\", \"input\": \"Speculative decoding, checked on a GPU.\", \"response_format\": \"wav\"}" \
      && echo "speech: $(stat -c %s "$dir/smoke.wav") bytes -> $dir/smoke.wav" || rc=1
    curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^pcgtts:spec_decode_num_(draft|accepted)_tokens_total' || true
  else
    echo "server did not become ready; see $dir/serve.log"
  fi
  kill $server 2>/dev/null; wait $server 2>/dev/null
  return $rc
}
trap 'kill $server 2>/dev/null' EXIT
"$PYTHON" -c "import numpy as np, soundfile as sf; t = np.arange(48000) / 16000; \
sf.write('$OUT/ref.wav', (0.2 * np.sin(2 * np.pi * 150 * t)).astype('float32'), 16000)"
smoke builtin; smoke_rc=$?
vllm_rc=0
if "$PYTHON" -c "from pcgtts.engine.vllm.versions import check_vllm; check_vllm()" 2>/dev/null; then
  smoke vllm; vllm_rc=$?
else
  echo "== vLLM not installed for $PYTHON: no vLLM smoke test (README: vLLM on a GPU host)"
fi
echo "random stand-ins: ${RANDOM_PARTS:-none}"
echo "sweep: exit $sweep_rc, smoke: exit $smoke_rc, vLLM smoke: exit $vllm_rc; total $((SECONDS - start)) s"
exit $(( sweep_rc != 0 || smoke_rc != 0 || vllm_rc != 0 ))
