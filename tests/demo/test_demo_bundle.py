"""The shipped demo bundle: manifest, family, codec, target/draft load in the engine and in transformers,
and a constrained generation speaks the text's phonemes in order and ends by itself."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from pcgtts.engine.model.feature_head import is_feature_head
from pcgtts.engine.speech.demo.layout import END, phoneme_runs
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle

MODEL_DIR = Path(os.environ.get("PCGTTS_DEMO_MODEL_DIR", DEFAULT_MODEL_DIR))
pytestmark = pytest.mark.skipif(not (MODEL_DIR / "pcgtts.json").exists(), reason="demo bundle not built")


@pytest.fixture(scope="module")
def bundle() -> ModelBundle:
    return ModelBundle.from_dir(MODEL_DIR)


def test_bundle_is_complete_and_small(bundle):
    assert bundle.family_name == "demo-phoneme" and bundle.codec_name == "demo-mel"
    for path in (bundle.target_dir, bundle.draft_dir, bundle.codec_dir, bundle.asg_table, bundle.voices_dir):
        assert path is not None and path.exists()
    size = sum(p.stat().st_size for p in MODEL_DIR.rglob("*") if p.is_file())
    assert size <= 60 * 2**20
    family = bundle.load_family()
    assert len(family.voices) >= 6 and family.default_voice in family.voices
    target = json.loads((bundle.target_dir / "config.json").read_text())
    # the bundle speculates with a feature head over the target's states; the small Llama draft beside it
    # serves `--draft` and the peers' benchmarks (transformers' assisted generation, vLLM's draft model)
    assert is_feature_head(bundle.draft_dir)
    head = json.loads((bundle.draft_dir / "config.json").read_text())
    assert head["hidden_size"] == target["hidden_size"]
    draft = json.loads((MODEL_DIR / "draft" / "config.json").read_text())
    assert target["vocab_size"] == head["vocab_size"] == draft["vocab_size"] == family.vocab.vocab_size
    assert draft["num_hidden_layers"] < target["num_hidden_layers"]


def test_transformers_loads_the_target(bundle):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(bundle.target_dir, dtype=torch.float32)
    family = bundle.load_family()
    ids = torch.tensor([family.build_prompt("Hello there.", None).token_ids])
    assert model(ids).logits.shape == (1, ids.shape[1], family.vocab.vocab_size)


def test_constrained_generation_follows_the_text(bundle):
    from pcgtts.engine import Engine, EngineConfig, SamplingParams

    family, codec = bundle.load_family(), bundle.load_codec()
    prompt = family.build_prompt("Good morning.", None)
    engine = Engine(EngineConfig(target=str(bundle.target_dir), draft=str(bundle.draft_dir),
                                 acceptance="exact", num_speculative_tokens=3))
    params = SamplingParams(temperature=0.0, max_tokens=400, stop_token_ids=prompt.stop_token_ids,
                            constraint=prompt.constraint)
    out = engine.generate([prompt.token_ids], params)[0].token_ids
    markers = [t for t in out if t in family.vocab.marker_ids]
    expected = family.phoneme_ids("Good morning.")
    assert markers == expected[:len(markers)]  # phonemes come in the text's order, none skipped
    if out[-1] == END:
        assert markers == expected
    audio = codec.decode(family.tokens_to_codes(out))
    assert audio.shape == (len(family.tokens_to_codes(out)) * 320,) and np.isfinite(audio).all()


def test_sampled_speech_keeps_every_phoneme_within_its_duration_bounds(bundle):
    from pcgtts.engine import Engine, EngineConfig, SamplingParams

    family = bundle.load_family()
    assert family.durations is not None  # the bundle ships a duration model
    texts = ["The rain in the valley fell all night.", "A small boat drifted past the harbour wall."]
    prompts = [family.build_prompt(t, None) for t in texts]
    bounds = [list(zip(p.constraint.min_frames, p.constraint.max_frames, strict=True)) for p in prompts]
    assert all(hi is not None and lo <= hi for b in bounds for lo, hi in b)
    engine = Engine(EngineConfig(target=str(bundle.target_dir), draft=str(bundle.draft_dir),
                                 acceptance="pcg", asg_table=str(bundle.asg_table), num_speculative_tokens=3))
    params = [SamplingParams(temperature=1.0, max_tokens=1000, stop_token_ids=p.stop_token_ids, seed=s,
                             constraint=p.constraint) for s, p in enumerate(prompts)]
    for gen, bound in zip(engine.generate([p.token_ids for p in prompts], params), bounds, strict=True):
        assert gen.finish_reason == "stop"
        runs = [frames for _, frames in phoneme_runs(family.vocab, gen.token_ids)]
        assert len(runs) == len(bound) and all(lo <= r <= hi for r, (lo, hi) in zip(runs, bound, strict=True))


def test_the_feature_head_drafts_what_the_target_samples(bundle):
    """The shipped head's proposals are accepted by exact speculative sampling more often than the small
    Llama draft's (0.46 of drafts at T=0.8, bench/results/step): a broken export or a head reading the
    wrong state would fall far below."""
    from pcgtts.engine import Engine, EngineConfig, SamplingParams

    family = bundle.load_family()
    engine = Engine(EngineConfig(target=str(bundle.target_dir), draft=str(bundle.draft_dir),
                                 acceptance="exact", num_speculative_tokens=3))
    assert engine.head is not None
    prompts = [family.build_prompt(t, None) for t in ("The rain in the valley fell all night.",
                                                      "A small boat drifted past the harbour wall.")]
    params = [SamplingParams(temperature=0.8, max_tokens=400, stop_token_ids=p.stop_token_ids, seed=s,
                             constraint=p.constraint) for s, p in enumerate(prompts)]
    gens = engine.generate([p.token_ids for p in prompts], params)
    rate = sum(g.num_accepted for g in gens) / sum(g.num_drafted for g in gens)
    assert rate > 0.5, rate
