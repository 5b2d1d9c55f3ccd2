#!/usr/bin/env bash
# Run-book for the real thing on one CUDA GPU (minutes): Llasa-1B as target with a smaller draft, its ASG
# table (`pcgtts asg build`), the acceptance sweep (target-only / exact / SSD / top-k / LANTERN / PCG side
# by side) and a `pcgtts serve` smoke test (voice upload through X-codec2's encoder, streamed speech).
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
# Results: OUT_DIR/{prepare.log,asg.log,sweep/acceptance.json,sweep.log,smoke.wav,serve.log}.
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

echo "== serve smoke test ($((SECONDS - start)) s)"
"$PYTHON" -m pcgtts.cli serve --model "$TARGET" --draft "$DRAFT" --codec "$CODEC" \
  ${SEMANTIC:+--semantic-model "$SEMANTIC"} --asg-table "$OUT/asg.safetensors" --device "$DEVICE" \
  --port "$PORT" --data-dir "$OUT/data" --max-tokens "$MAX_TOKENS" >"$OUT/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
smoke_rc=1
for _ in $(seq 600); do
  if curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null; then smoke_rc=0; break; fi
  kill -0 $server 2>/dev/null || break
  sleep 1
done
if [ $smoke_rc = 0 ]; then
  voice=alloy
  "$PYTHON" -c "import numpy as np, soundfile as sf; t = np.arange(48000) / 16000; \
sf.write('$OUT/ref.wav', (0.2 * np.sin(2 * np.pi * 150 * t)).astype('float32'), 16000)"
  code=$(curl -s -o "$OUT/upload.json" -w '%{http_code}' "http://127.0.0.1:$PORT/v1/audio/voices" \
    -F name=ref -F transcript="A short reference clip." -F audio_sample=@"$OUT/ref.wav")
  echo "voice upload: HTTP $code $(cat "$OUT/upload.json")"
  [ "$code" = 201 ] && voice=ref
  [ "$voice" = ref ] || echo "(no voice: a Llasa checkpoint has no presets, so the request below fails)"
  curl -sf -o "$OUT/smoke.wav" "http://127.0.0.1:$PORT/v1/audio/speech" -H 'Content-Type: application/json' \
    -d "{\"model\": \"llasa\", \"voice\": \"$voice\", \"input\": \"Speculative decoding, checked on a GPU.\", \"response_format\": \"wav\"}" \
    && echo "speech: $(stat -c %s "$OUT/smoke.wav") bytes -> $OUT/smoke.wav" || smoke_rc=1
else
  echo "server did not become ready; see $OUT/serve.log"
fi
kill $server 2>/dev/null; wait $server 2>/dev/null
echo "random stand-ins: ${RANDOM_PARTS:-none}"
echo "sweep: exit $sweep_rc, smoke: exit $smoke_rc; total $((SECONDS - start)) s"
exit $(( sweep_rc != 0 || smoke_rc != 0 ))
