"""`pcgtts bench profile` on a tiny bundle: the phases account for the step; the engine is left as it was."""

from __future__ import annotations

import argparse
import json

import pytest
from pcgtts.bench import profile
from pcgtts.bench.common import bundle_engine, speech_requests
from pcgtts.engine.model.llama import fbgemm_available
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle
from server_support import build_tiny_bundle

from pcgtts.cli import main as pcgtts_main


def test_phases_add_up_to_the_step_at_every_batch_size(tmp_path):
    bundle = build_tiny_bundle(tmp_path / "bundle")
    out = tmp_path / "out"
    assert pcgtts_main(["bench", "profile", "--model", str(bundle), "--batch-sizes", "2", "3",
                        "--max-tokens", "24", "--repeats", "1", "--top-ops", "5", "--out", str(out)]) == 0
    result = json.loads((out / "profile.json").read_text())
    assert {(r["rule"], r["batch"]) for r in result["rows"]} == {(rule, b) for rule in ("target-only", "pcg")
                                                                 for b in (2, 3)}
    for row in result["rows"]:
        phases = row["phase_ms_per_step"]
        assert set(phases) == set(profile.PHASES) and min(phases.values()) >= 0
        # exclusive times: together they are the step, short of generate()'s own loop around it
        assert 0.7 * row["step_ms"] <= sum(phases.values()) <= row["step_ms"] * 1.001
        assert phases["target forward"] > 0 and phases["schedule"] > 0 and phases["target attention"] > 0
        assert (phases["verify"] > 0) == (row["rule"] == "pcg")
    for rule in ("target-only", "pcg"):
        assert len(result["ops"][rule]["ops"]) == 5
        assert {"fixed_ms", "per_row_ms"} == set(result["fits"][rule]["step"])
    assert "| target forward |" in (out / "profile.md").read_text()


def test_a_profiled_engine_decodes_as_before_afterwards(tmp_path):
    """The timing wrappers come off: the same seeded requests give the same tokens before and after."""
    bundle = ModelBundle.from_dir(build_tiny_bundle(tmp_path / "bundle"))
    engine = bundle_engine(bundle, "pcg")
    prompts, params = speech_requests(bundle, 2, 0.8, 24)
    before = [g.token_ids for g in engine.generate(prompts, params)]
    profile.decode(engine, prompts, params)
    assert vars(engine.decoder).get("step") is None and type(engine.decoder.head).__name__ != "TimedCall"
    assert all(vars(engine.target.backend).get(a) is None for a in profile.ATTENTION_CALLS)
    assert [g.token_ids for g in engine.generate(prompts, params)] == before
    args = argparse.Namespace(temperature=0.8, max_tokens=24, seeded=False)
    assert all(p.seed is None for p in profile.requests(bundle, 2, args)[1])


def test_bench_step_runs_each_attention_and_weights_it_is_given(tmp_path):
    """`--graphs MODE[+DETERMINISTIC][/ATTENTION][/WEIGHTS]`: one engine per form, each reported under its
    label; an unknown setting is refused; the shipped bundle's fp16 weights get their copies unless fp32."""
    bundle = build_tiny_bundle(tmp_path / "bundle")
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match="unknown setting 'int4'"):
        pcgtts_main(["bench", "step", "--model", str(bundle), "--graphs", "eager/int4", "--out", str(out)])
    assert pcgtts_main(["bench", "step", "--model", str(bundle), "--graphs", "eager", "eager+off/sdpa/fp32",
                        "--rules", "target-only", "--batch-sizes", "2", "--repeats", "1",
                        "--max-tokens", "12", "--utterances", "2", "--out", str(out)]) == 0
    rows = json.loads((out / "step_speed.json").read_text())["rows"]
    assert {r["graphs"] for r in rows} == {"eager", "eager+off/sdpa/fp32"}
    assert all(r["tokens_per_s"] > 0 for r in rows)
    tiny = ModelBundle.from_dir(bundle)
    engines = {a: bundle_engine(tiny, "pcg", cpu_attention=a) for a in ("rows", "sdpa")}
    assert engines["rows"].target.row_attention and not engines["sdpa"].target.row_attention
    shipped = ModelBundle.from_dir(DEFAULT_MODEL_DIR)
    if fbgemm_available():
        assert bundle_engine(shipped, "target-only").half_weight_products > 0
    assert bundle_engine(shipped, "target-only", cpu_weights="fp32").half_weight_products == 0
