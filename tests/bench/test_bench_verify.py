"""`pcgtts bench verify --model`: every rule timed on the bundle's own decode steps."""

from __future__ import annotations

import json

import torch
from pcgtts.bench.bundle_verify import capture_steps, exact_engine
from pcgtts.bench.common import speech_requests
from pcgtts.tts.bundle import ModelBundle
from server_support import build_tiny_bundle

from pcgtts.cli import main as pcgtts_main


def test_captured_steps_are_the_engines_verify_inputs(tmp_path):
    """Every speculative step of the decode is kept, shaped [B, γ] / [B, γ, V] / [B, γ+1, V] with B the
    batch size, the draft tokens drawn where the draft put probability; the engine's own verify still
    runs (the decode completes) and the recorder is gone afterwards."""
    bundle = ModelBundle.from_dir(build_tiny_bundle(tmp_path / "bundle"))
    engine = exact_engine(bundle)
    prompts, params = speech_requests(bundle, 2, 0.8, 24)
    steps = capture_steps(engine, prompts, params, batch_size=2)
    assert steps and "_verify" not in vars(engine.decoder)
    v = engine.target.model.cfg.vocab_size
    for drafts, draft_probs, target_probs in steps:
        b = drafts.shape[0]
        assert b in (1, 2) and drafts.shape == (b, 3)  # rows leave the batch as they finish
        assert draft_probs.shape == (b, 3, v) and target_probs.shape == (b, 4, v)
        assert torch.allclose(target_probs.sum(-1), torch.ones(b, 4), atol=1e-5)
        assert bool((torch.gather(draft_probs, 2, drafts[..., None]) > 0).all())
    assert steps[0][0].shape[0] == 2


def test_verify_bench_times_every_rule_against_exact(tmp_path):
    bundle = build_tiny_bundle(tmp_path / "bundle")
    code = pcgtts_main(["bench", "verify", "--model", str(bundle), "--batch-sizes", "1", "2", "--utterances",
                        "2", "--max-tokens", "24", "--reps", "2", "--out", str(tmp_path / "out")])
    assert code == 0
    result = json.loads((tmp_path / "out" / "verify_bundle.json").read_text())
    rows = result["rows"]
    assert {r["batch"] for r in rows} == {1, 2}
    assert {r["rule"] for r in rows} == {"exact", "exact torch ops", "block", "block torch ops", "ssd β=0.2",
                                         "top-k k=3", "pcg θ=0.25", "pcg θ=0.25 torch ops",
                                         "pcg-block θ=0.25", "pcg-block θ=0.25 torch ops"}
    for r in rows:
        assert r["steps"] > 0 and len(r["runs"]) == 2 and r["us_per_verify"] > 0
        assert 0 <= r["accepted_per_row"] <= 3 and r["accepted_per_row_se"] >= 0
        if r["rule"] == "exact":
            assert r["x_exact"] == 1.0
    assert result["command"].startswith("pcgtts bench verify --model")

