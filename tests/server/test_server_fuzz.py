"""Schemathesis over the served OpenAPI schema against a real `pcgtts serve` on loopback, on a time budget:
no 5xx, responses conform to the schema (status codes, content types, bodies, headers), invalid data is
refused, and schema-valid speech requests are accepted: the schema states the loaded model's own limits
(top_k, num_speculative_tokens, max_tokens, rules, ASG tables), so none is refused with a 400. The run's
report lands in artifacts/schemathesis.txt."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from server_support import free_port, wait_ready

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
BUDGET_S = 90  # fuzzing time; with start-up the test takes ~2 minutes on 2 cores
HOOKS = Path(__file__).with_name("schemathesis_hooks.py")  # a real clip where the schema says "ref_audio"
# What a schema cannot say, per operation. A speech request may be well formed and still unspeakable (422:
# no speakable sounds in `input`) or name a voice that does not exist (404); any 400 is a schema-valid
# request rejected. An upload must be a 1-30 s clip of audio with its transcript, which no schema states:
# its own tests (test_server_voices.py) check what is refused and why.
CONFIG = """
[[operations]]
include-name = "POST /v1/audio/speech"
checks.positive_data_acceptance.expected-statuses = ["2xx", "404", "422", "429"]

[[operations]]
include-name = "POST /v1/audio/voices"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "404", "409", "413", "429"]
"""


@pytest.mark.slow
def test_schemathesis_finds_no_server_error_and_no_contract_violation(demo_bundle, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PCGTTS_MODEL": str(demo_bundle), "PCGTTS_PORT": str(port),
           "PCGTTS_DATA_DIR": str(tmp_path), "PCGTTS_LOG_LEVEL": "warning"}
    log = tmp_path / "serve.log"
    server = subprocess.Popen([sys.executable, "-m", "pcgtts.cli", "serve"], env=env,
                              stdout=subprocess.DEVNULL, stderr=log.open("w"))
    try:
        wait_ready(url, server, log)
        schemathesis = Path(sys.executable).with_name("schemathesis")
        (tmp_path / "schemathesis.toml").write_text(CONFIG)  # read from the working directory
        hooks = {"SCHEMATHESIS_HOOKS": HOOKS.stem,  # imports server_support, one folder up
                 "PYTHONPATH": os.pathsep.join([str(HOOKS.parent), str(HOOKS.parent.parent)])}
        run = subprocess.run(
            [str(schemathesis), "run", url + "/openapi.json", "--checks", "all",
             "--exclude-checks", "ignored_auth",  # the fuzz server runs without a key
             "--max-time", str(BUDGET_S), "--request-timeout", "60", "--workers", "2", "--seed", "1",
             "--no-color"],
            capture_output=True, text=True, timeout=BUDGET_S + 240,
            env={**os.environ, "NO_COLOR": "1", **hooks},
            cwd=tmp_path)  # schemathesis keeps a cache directory in its working directory
    finally:
        server.terminate()
        server.wait(timeout=60)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "schemathesis.txt").write_text(run.stdout + run.stderr)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "Configuration:    " + str(tmp_path / "schemathesis.toml") in run.stdout  # the per-operation rules
    assert "Schema-valid request rejected" not in run.stdout and "Server error" not in run.stdout
    generated = int(re.search(r"(\d+) generated", run.stdout).group(1))
    assert generated > 200, run.stdout[-3000:]
    assert "Traceback" not in log.read_text(), log.read_text()[-4000:]
