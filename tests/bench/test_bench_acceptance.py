"""`pcgtts bench acceptance` end to end on a tiny bundle: the output contract other checks read."""

from __future__ import annotations

import json

from server_support import build_tiny_bundle

from pcgtts.cli import main as pcgtts_main

REQUIRED = {"rule", "params", "acceptance_rate", "mean_accepted_len", "tokens_per_s", "speedup", "wer"}


def test_quick_sweep_writes_acceptance_json(tmp_path):
    bundle = build_tiny_bundle(tmp_path / "bundle")
    out = tmp_path / "out"
    code = pcgtts_main(["bench", "acceptance", "--model", str(bundle), "--out", str(out), "--quick",
                        "--no-asr", "--rules", "exact,pcg", "--max-tokens", "60"])
    assert code == 0
    rows = json.loads((out / "acceptance.json").read_text())
    assert [r["rule"] for r in rows] == ["target-only", "exact", "pcg", "pcg"]  # the table's θ and θ - 0.1
    for row in rows:
        assert REQUIRED <= row.keys()
        assert row["tokens_per_s"] > 0 and row["tokens"] > 0
    base, exact, pcg, looser = rows
    assert base["speedup"] == 1.0 and base["acceptance_rate"] is None and base["mean_accepted_len"] == 1.0
    for row in (exact, pcg, looser):
        assert 0.0 <= row["acceptance_rate"] <= 1.0
        # tokens per target forward: 1 + accepted per step, so within [1, γ + 1]
        assert 1.0 <= row["mean_accepted_len"] <= row["num_speculative_tokens"] + 1
    assert pcg["params"]["theta"] > 0 and looser["params"]["theta"] == round(pcg["params"]["theta"] - 0.1, 4)
    assert (out / "acceptance.png").stat().st_size > 0
