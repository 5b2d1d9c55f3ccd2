"""`pcgtts bench engine` end to end on the embedded pair: our modes and transformers side by side, CPU
time beside wall time, and a peer that is not installed reported as a skip row, never as a number."""

from __future__ import annotations

import json
from pathlib import Path

from pcgtts.cli import main as pcgtts_main

BUNDLE = Path(__file__).resolve().parents[2] / "models" / "demo-en"


def test_engine_bench_rows_and_missing_vllm_peer(tmp_path):
    out = tmp_path / "out"
    code = pcgtts_main(["bench", "engine", "--target", str(BUNDLE / "target"),
                        "--draft", str(BUNDLE / "draft"), "--asg-table", str(BUNDLE / "asg.safetensors"),
                        "--speech-prompts", str(BUNDLE), "--batch-sizes", "1", "2", "--repeats", "1",
                        "--max-tokens", "12", "--no-hf-assisted",
                        "--vllm-python", str(tmp_path / "no-such-env" / "python"), "--out", str(out)])
    assert code == 0
    rows = json.loads((out / "engine.json").read_text())["rows"]
    measured = {(r["mode"], r["batch"]): r for r in rows if not r.get("skipped")}
    for mode in ("target-only", "exact", "pcg", "transformers"):
        for batch in (1, 2):
            row = measured[(mode, batch)]
            assert row["tokens"] == 12 * batch and row["tokens_per_s"] > 0
            assert 0 < row["cpu_per_wall"] < 4  # process CPU seconds per wall second: one to two cores
            assert 0 <= row["unlikely_token_share"] <= 1
    assert measured[("target-only", 1)]["speedup"] == 1.0
    skipped = [r for r in rows if r.get("skipped")]
    assert [r["batch"] for r in skipped if r["mode"] == "vllm"] == [1, 2]
    assert all("no Python at" in r["skipped"] for r in skipped)
    table = (out / "table.md").read_text()
    assert table.count("| 2 | exact |") == 1 and "skipped: no Python at" in table
    assert (out / "engine.png").stat().st_size > 0


def test_vllm_rounds_before_and_after_ours_merge_into_one_median():
    """vLLM runs once before and once after our runners; its row is the median over both rounds' repeats,
    and one failed round turns every vLLM row into a skip with its reason."""
    from argparse import Namespace

    from pcgtts.bench.engine_bench import BenchSetup, vllm_rows

    args = Namespace(batch_sizes=[1], temperature=0.8)
    setup = BenchSetup(BUNDLE / "target", None, None, "demo")
    job = {"prompts": {1: [[1, 2, 3]]}}

    def round_of(times, cpu, rate):
        return {"version": "0.32.0", "plugin": True, "rows": [
            {"mode": "vllm-pcg", "batch": 1, "tokens": 8, "times_s": times, "cpu_s": cpu,
             "samples": [[200, 201, 202, 203]], "acceptance_rate": rate,
             "tokens_per_verify_step": None if rate is None else 1 + 3 * rate}]}

    rows = vllm_rows(args, setup, job, [round_of([1.0, 1.2, 5.0], [2.0, 2.4, 10.0], 0.2),
                                        round_of([2.0, 2.2, 2.4], [4.0, 4.4, 4.8], 0.4)])
    (row,) = rows
    assert row["rounds"] == 2 and row["times_s"] == [1.0, 1.2, 5.0, 2.0, 2.2, 2.4]
    assert row["median_s"] == 2.1 and row["tokens_per_s"] == 8 / 2.1
    assert abs(row["cpu_per_wall"] - 4.2 / 2.1) < 1e-12 and abs(row["acceptance_rate"] - 0.3) < 1e-12
    assert abs(row["tokens_per_verify_step"] - 1.9) < 1e-12
    assert "plugin" in row["peer"] and 0 <= row["unlikely_token_share"] <= 1
    failed = vllm_rows(args, setup, job, [round_of([1.0], [2.0], None), "vLLM peer failed (exit 1): oom"])
    assert failed == [{"mode": "vllm", "batch": 1, "skipped": "vLLM peer failed (exit 1): oom"}]
