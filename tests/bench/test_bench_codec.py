"""`pcgtts bench codec` on the embedded codec: runs, and reports the first block's earlier audio."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR


@pytest.mark.skipif(not (DEFAULT_MODEL_DIR / "codec").exists(), reason="embedded model not built yet")
def test_codec_bench_reports_batching_and_first_block(tmp_path):
    subprocess.run([sys.executable, "-m", "pcgtts.cli", "bench", "codec", "--streams", "1", "3", "--seconds",
                    "1", "--repeats", "1", "--out", str(tmp_path)], check=True, timeout=300)
    report = json.loads((tmp_path / "codec.json").read_text())
    assert [r["streams"] for r in report["decode"]] == [1, 3]
    assert all(r["batched_s"] > 0 and r["one_by_one_s"] > 0 for r in report["decode"])
    first = {r["schedule"]: r["codes_before_audio"] for r in report["first_audio"]}
    assert first["shipped"] < first["full_context"]  # 16 + 6 look-ahead vs 16 + 6 + conv context
