"""`pcgtts bench draft-length` end to end on a tiny bundle: fixed γ against confidence-following lengths and a
token tree."""

from __future__ import annotations

import json

import pytest
from server_support import build_tiny_bundle

from pcgtts.cli import main as pcgtts_main


def test_draft_length_rows_count_what_each_setting_drafted(tmp_path):
    bundle = build_tiny_bundle(tmp_path / "bundle", head_draft=True)
    out = tmp_path / "out"
    code = pcgtts_main(["bench", "draft-length", "--model", str(bundle), "--out", str(out),
                        "--rules", "exact", "--settings", "3:0", "6:0.5", "3:0:2", "--batch-sizes", "1", "2",
                        "--repeats", "1", "--max-tokens", "40"])
    assert code == 0
    result = json.loads((out / "draft_length.json").read_text())
    assert result["machine"]["cpu"] and result["command"]
    rows = {(r["rule"], r["num_speculative_tokens"], r["draft_confidence"], r["draft_branches"],
             r["batch"]): r for r in result["rows"]}
    assert len(rows) == 8 and (out / "draft_length.png").stat().st_size > 0
    for batch in (1, 2):
        assert rows[("target-only", 0, 0.0, 1, batch)]["tokens_per_verify_step"] == 1.0
        fixed, follows = rows[("exact", 3, 0.0, 1, batch)], rows[("exact", 6, 0.5, 1, batch)]
        tree = rows[("exact", 3, 0.0, 2, batch)]
        assert tree["mean_draft_length"] == 3.0 and 1.0 <= tree["tokens_per_verify_step"] <= 4
        assert fixed["mean_draft_length"] == 3.0  # θ = 0: every speculative step drafts γ
        assert 1.0 <= follows["mean_draft_length"] <= 6.0
        for row, gamma in ((fixed, 3), (follows, 6)):
            drafted = row["drafted_per_position"]
            assert len(drafted) == gamma and drafted == sorted(drafted, reverse=True)  # lengths, not holes
            assert 1.0 <= row["tokens_per_verify_step"] <= gamma + 1
            survival = [a for a in row["acceptance_by_position"] if a is not None]
            assert all(0.0 <= a <= 1.0 for a in survival)


def test_draft_length_under_the_auto_policy_counts_the_lengths_it_ran(tmp_path):
    """`--speculation auto` with a setting of two lengths: the engine's steps ran at the lengths the policy
    chose among (target-only, 3 and 5), counted per row, and the per-position counts reach the 5th draft."""
    bundle = build_tiny_bundle(tmp_path / "bundle", head_draft=True)
    out = tmp_path / "out"
    code = pcgtts_main(["bench", "draft-length", "--model", str(bundle), "--out", str(out), "--rules",
                        "exact", "--settings", "3:0", "3+5:0", "--speculation", "auto", "--batch-sizes", "1",
                        "--repeats", "1", "--max-tokens", "60"])
    assert code == 0
    result = json.loads((out / "draft_length.json").read_text())
    assert result["speculation"] == "auto"
    rows = {(r["num_speculative_tokens"], tuple(r["speculation_lengths"])): r for r in result["rows"]
            if r["rule"] == "exact"}
    one, two = rows[(3, ())], rows[(3, (5,))]
    assert set(one["steps_by_draft_length"]) <= {"0", "3"} and "3" in one["steps_by_draft_length"]
    # each length timed at least once
    assert {"3", "5"} <= set(two["steps_by_draft_length"]) <= {"0", "3", "5"}
    assert len(two["drafted_per_position"]) == 5 and two["drafted_per_position"][4] > 0
    assert "3+5" in (out / "draft_length.md").read_text()
    # more lengths need the policy that chooses among them
    with pytest.raises(SystemExit, match="--speculation auto"):
        pcgtts_main(["bench", "draft-length", "--model", str(bundle), "--out", str(out), "--settings",
                     "3+5:0", "--batch-sizes", "1", "--repeats", "1", "--max-tokens", "10"])
