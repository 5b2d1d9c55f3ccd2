# CPU image of the pcgtts server with the embedded demo model.
# GPU: build with --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 and run with
# PCGTTS_DEVICE=cuda on a host with the NVIDIA container toolkit.
FROM python:3.11-slim-bookworm

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
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

RUN useradd --create-home --uid 1000 pcgtts && mkdir -p /data && chown 1000:1000 /data
USER 1000:1000
VOLUME ["/data"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s CMD ["curl", "-fsS", "http://localhost:8000/ready"]
# SIGTERM drains (PCGTTS_DRAIN_TIMEOUT_S, default 25 s) and exits 0: give `docker stop` more than that
# (docker-compose.yml sets stop_grace_period).
STOPSIGNAL SIGTERM
CMD ["pcgtts", "serve"]
