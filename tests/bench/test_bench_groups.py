"""`pcgtts bench rejections` end to end on a tiny bundle, the swap test's group swap, and the acceptance
sweep with an acoustic bundle table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from pcgtts.asg_tables import ASGTable, build_asg
from pcgtts.bench.acceptance_sweep import BUNDLE_TABLE, TableCache, default_specs
from pcgtts.bench.groups import swap_codes
from pcgtts.tts.bundle import ModelBundle
from server_support import build_tiny_bundle

from pcgtts.cli import main as pcgtts_main


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory) -> Path:
    return build_tiny_bundle(tmp_path_factory.mktemp("groups") / "bundle")


def test_rejections_report_accounts_for_every_verified_position(tiny_bundle, tmp_path):
    code = pcgtts_main(["bench", "rejections", "--model", str(tiny_bundle), "--out", str(tmp_path),
                        "--sentences", "2", "--max-tokens", "60"])
    assert code == 0
    report = json.loads((tmp_path / "rejections.json").read_text())
    run = report["engine_run"]
    by_pos = [report["by_position"][str(i)] for i in (1, 2, 3)]
    # every step verifies position 1; a later position only after the one before it was accepted
    assert by_pos[0]["verified"] == run["steps"]
    for before, after in zip(by_pos, by_pos[1:], strict=False):
        assert after["verified"] == before["accepted"]
    assert sum(p["accepted"] for p in by_pos) == run["accepted"]
    classes = report["by_draft_class"]
    assert sum(c["verified"] for c in classes.values()) == sum(p["verified"] for p in by_pos)
    # where the decode constraint forces a token both models put probability 1 on it: always accepted
    for c in classes.values():
        assert c["forced"] <= c["accepted"] <= c["verified"]
    rejected = sum(p["verified"] - p["accepted"] for p in by_pos)
    assert sum(report["rejections"]["by_class_pair"].values()) == rejected
    # grouping can only add acceptance: Σ_k min(P_c, Q_c) >= Σ_t min(p, q) under the equal split
    assert 0.0 < report["alpha_exact"] < 1.0
    for row in report["alpha_by_table"]:
        assert report["alpha_exact"] - 1e-6 <= row["alpha_pcg"] <= 1.0 + 1e-6
    acoustic = [r for r in report["alpha_by_table"] if r["grouping"] == "acoustic"]
    sizes = [r["mean_seed_group"] for r in acoustic]
    assert sizes == sorted(sizes) and sizes[0] >= 1.0  # larger radius, larger groups


def test_swap_replaces_tokens_only_within_their_seed_group():
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(50, 4, generator=gen)
    table = build_asg(emb, 0.8, offset=10, vocab_size=70, progress=False, metric="l2")
    tokens = [int(t) for t in torch.randint(0, 70, (400,), generator=gen)]
    swapped, changed = swap_codes(tokens, table, np.random.default_rng(0))
    assert changed == sum(a != b for a, b in zip(tokens, swapped, strict=True)) > 0
    for a, b in zip(tokens, swapped, strict=True):
        assert b in table.members(int(table.seed_group[a])).tolist()
        if not 10 <= a < 60:
            assert a == b  # outside the speech range every token is a singleton


def test_acceptance_sweep_runs_an_acoustic_bundle_table_as_its_own_row(tiny_bundle, tmp_path):
    codebook = ModelBundle.from_dir(tiny_bundle).load_codec().codebook
    vocab_size = ASGTable.load(tiny_bundle / "asg.safetensors").vocab_size
    table = build_asg(codebook, 3.0, offset=176, vocab_size=vocab_size, progress=False, metric="l2",
                      meta={"name": "mel-test"})
    table.save(tmp_path / "asg.safetensors")
    manifest = json.loads((tiny_bundle / "pcgtts.json").read_text())
    bundle = ModelBundle.from_dir(tiny_bundle)
    bundle.asg_table = tmp_path / "asg.safetensors"
    cache = TableCache(bundle, tmp_path)
    assert cache.bundle_theta is None and cache.bundle_table == "mel-test"
    assert cache.path(BUNDLE_TABLE) == tmp_path / "asg.safetensors"
    specs = default_specs(True, cache.bundle_theta, cache.bundle_table)
    pcg = [s for s in specs if s.rule == "pcg"]
    assert pcg[0].label == "pcg mel-test" and pcg[0].theta == BUNDLE_TABLE
    assert [s.theta for s in pcg[1:]] == [0.55, 0.45]  # the paper's cosine groups stay as comparisons
    assert manifest["asg_table"] == "asg.safetensors"


def test_paired_bootstrap_intervals_cover_the_shift_they_are_given():
    """A run whose every utterance has one more error in ten words than the baseline's: ΔWER is 0.1 in every
    resample (a point interval); a similarity shifted by noise around +0.05 gets an interval around +0.05
    that excludes 0; the baseline against itself gets [0, 0]."""
    from pcgtts.bench.groups import paired_bootstrap

    rng = np.random.default_rng(0)
    n = 200
    base = {"rows": list(range(n)), "errors": [2] * n, "words": [10] * n,
            "similarities": rng.uniform(0.6, 0.8, n).tolist()}
    row = {"rows": list(range(n)), "errors": [3] * n,
           "similarities": (np.array(base["similarities"]) + 0.05 + rng.normal(0, 0.02, n)).tolist()}
    ci = paired_bootstrap(base, row)
    assert np.allclose(ci["delta_wer_ci95"], [0.1, 0.1])
    lo, hi = ci["delta_similarity_ci95"]
    assert 0.04 < lo < 0.05 < hi < 0.06
    same = paired_bootstrap(base, base | {"rows": list(range(n))})
    assert same["delta_wer_ci95"] == [0.0, 0.0] and same["delta_similarity_ci95"] == [0.0, 0.0]
