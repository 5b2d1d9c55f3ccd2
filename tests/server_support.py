"""Helpers for the server tests: a model bundle to serve, a real uvicorn server on a loopback port, and
test audio.

`demo_bundle_dir()` prefers the embedded model (models/demo-en, once its trained weights exist); until
then it builds a tiny *random* bundle with the real demo family and codec: random Llama target and draft
(transformers), a random codec codebook, an ASG table from the target's code embeddings and two preset
voices. Random weights speak noise, but every interface (prompts, constraint, speculative decoding,
streaming codec decode) is the real one.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import torch
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, MANIFEST
from safetensors.torch import load_file

TINY_CODEBOOK = 1024  # codes; with 160 marker slots a random model speaks ~6 frames per phoneme
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "She sells sea shells by the sea shore.",
             "How much wood would a woodchuck chuck?", "Pack my box with five dozen liquor jugs.",
             "Numbers like 42 and 7, vowels and consonants: a e i o u, th sh ch ng zh."]


def embedded_model_ready(root: Path = DEFAULT_MODEL_DIR) -> bool:
    return (root / MANIFEST).exists() and any((root / "target").glob("*.safetensors"))


def build_tiny_bundle(root: Path, seed: int = 0, head_draft: bool = False) -> Path:
    """A tiny demo-family bundle; its draft a 1-layer copy of the target, or with head_draft a feature head
    (what token trees need)."""
    from engine_support import save_draft_from, save_feature_head, save_tiny_llama
    from pcgtts.asg_tables import build_asg
    from pcgtts.engine.codec.demo.codec import DemoMelCodec
    from pcgtts.engine.speech.demo.espeak import phonemize
    from pcgtts.engine.speech.demo.layout import DemoVocab

    root.mkdir(parents=True, exist_ok=True)
    inventory = sorted({p for s in SENTENCES for p in phonemize(s)})
    vocab = DemoVocab(phonemes=tuple(inventory), codebook_size=TINY_CODEBOOK)
    vocab.save(root / "family.json")
    spec = json.loads((root / "family.json").read_text())
    (root / "family.json").write_text(json.dumps({**spec, "default_voice": "tiny-a"}, indent=1))

    gen = torch.Generator().manual_seed(seed)
    codebook = -5.0 + 4.0 * torch.rand(TINY_CODEBOOK, 80, generator=gen)  # plausible log-mel levels
    DemoMelCodec(codebook).save(root / "codec")

    save_tiny_llama(root / "target", vocab=vocab.vocab_size, hidden=64, layers=2, seed=seed,
                    max_positions=4096)
    if head_draft:
        save_feature_head(root / "target", root / "draft", seed=seed + 1)
    else:
        save_draft_from(root / "target", root / "draft", layers=1, noise=0.3, seed=seed + 1)
    weights = load_file(next((root / "target").glob("*.safetensors")))
    embeddings = weights["model.embed_tokens.weight"][vocab.code_offset:].float()  # [K, D]
    build_asg(embeddings, 0.25, offset=vocab.code_offset, vocab_size=vocab.vocab_size,
              progress=False).save(root / "asg.safetensors")

    rng = np.random.default_rng(seed)
    (root / "voices").mkdir(exist_ok=True)
    for name in ("tiny-a", "tiny-b"):
        codes = rng.integers(0, TINY_CODEBOOK, size=60).tolist()
        voice = {"codes": codes, "transcript": "a test voice"}
        (root / "voices" / f"{name}.json").write_text(json.dumps(voice))
    manifest = {"family": "demo-phoneme", "codec_type": "demo-mel", "target": "target", "draft": "draft",
                "codec": "codec", "asg_table": "asg.safetensors", "voices": "voices"}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, process: subprocess.Popen, log: Path, timeout: float = 180.0) -> None:
    """Until the `pcgtts serve` process at `url` answers /ready with 200; fails with the end of its log
    (`log`: where its stderr goes) if it exits or the deadline passes first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
        time.sleep(0.2)


@contextlib.contextmanager
def serve_process(env: dict[str, str], args: list[str] = (), ready_timeout: float = 300.0,
                  command: list[str] | None = None, cwd: Path | None = None):
    """`pcgtts serve ARGS` as a real process on a free loopback port, until /ready answers 200.
    `command` runs another installation's `pcgtts` (default: this interpreter's). Yields its base URL;
    terminates it afterwards. The server's stderr (its children's too: vLLM's engine core) goes to a file, and
    a test that fails inside the block prints the file's tail, so a server-side cause (an engine that died)
    shows in the failure; a pipe that nobody reads while the test runs would also block the server once its
    64 KiB buffer filled."""
    port = free_port()
    command = command or [sys.executable, "-m", "pcgtts.cli"]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen([*command, "serve", "--port", str(port), *args], cwd=cwd,
                                   env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=log)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline, status = time.monotonic() + ready_timeout, None
            while time.monotonic() < deadline and process.poll() is None:
                try:
                    status = httpx.get(url + "/ready", timeout=2).status_code
                except httpx.TransportError:
                    status = None
                if status == 200:
                    break
                time.sleep(0.2)
            assert status == 200, log_tail(log) if process.poll() is not None else "not ready"
            yield url
        except BaseException:
            print(f"server log, last lines:\n{log_tail(log)}", file=sys.stderr)
            raise
        finally:
            process.terminate()
            process.wait(timeout=30)


def log_tail(log, size: int = 8192) -> str:
    """The last `size` bytes of an open log file, as text."""
    log.flush()
    log.seek(max(0, os.fstat(log.fileno()).st_size - size))
    return log.read().decode(errors="replace")


class LiveServer:
    """The real app on a real uvicorn server in a background thread, on 127.0.0.1:<free port>."""

    def __init__(self, settings, service=None):
        import uvicorn
        from pcgtts.server.app import create_app

        self.settings = settings
        self.app = create_app(settings, service)
        self.port = settings.port
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                timeout_graceful_shutdown=3)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="uvicorn", daemon=True)

    @property
    def state(self):
        return self.app.state.pcgtts

    def start(self, ready_timeout: float = 300.0, wait_for_model: bool = True) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + ready_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        while wait_for_model and self.state.service is None:
            if self.state.load_error or time.monotonic() > deadline:
                raise RuntimeError(f"model did not load: {self.state.load_error}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)


def wait_until(condition, what: str | Callable[[], str], timeout: float = 10.0) -> None:
    """Polls `condition()` until it holds; fails with `what` (or what it returns, read at the deadline) if
    it still does not after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.01)


def wait_running(service, timeout: float = 10.0) -> None:
    """Until a request holds KV blocks (between two sentences of one input, none may for a moment)."""
    deadline = time.monotonic() + timeout
    while not (service.engine_stats().num_running >= 1 and service.engine_stats().kv_usage > 0):
        assert time.monotonic() < deadline, "no request is running"
        time.sleep(0.005)


def idle(service) -> bool:
    """The engine has no running or waiting request and no KV block in use."""
    s = service.engine_stats()
    return s.num_running == 0 and s.num_waiting == 0 and s.kv_usage == 0


def wait_idle(service, timeout: float = 10.0) -> None:
    """Until the engine is idle; fails with its counters if it still is not after `timeout` s."""
    wait_until(lambda: idle(service), lambda: f"engine still busy: {service.engine_stats()}", timeout)


def aborted(service) -> int:
    """Requests the engine has ended by abort so far."""
    return service.engine_stats().finished.get("abort", 0)


def wait_aborted(service, aborted_before: int, timeout: float = 10.0) -> None:
    """Until the engine is idle after aborting a request (more aborts than `aborted_before`): a request
    whose client left was cut off and freed, not run to its end."""
    wait_until(lambda: idle(service) and aborted(service) > aborted_before,
               lambda: f"no request aborted and freed: {service.engine_stats()}", timeout)


def tone(seconds: float, rate: int = 22050, freq: float = 180.0) -> np.ndarray:
    """A voiced-sounding test clip: a harmonic-rich tone with a slow amplitude envelope, float32."""
    t = np.arange(int(seconds * rate)) / rate
    wave = sum(np.sin(2 * np.pi * freq * k * t) / k for k in range(1, 8))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 2.0 * t)
    return (0.2 * wave * envelope).astype(np.float32)
