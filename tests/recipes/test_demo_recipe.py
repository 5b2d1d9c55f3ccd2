"""The demo recipe's data path: sentence cleaning, training examples, batch plan, schedule, draft init."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pcgtts.engine.speech.demo.layout import END, SPEECH, DemoVocab, prompt_tokens
from pcgtts.recipes.demo.lm_data import IGNORE, BatchPlan, Utterances, example, make_batch
from pcgtts.recipes.demo.text_corpus import MAX_WORDS, MIN_WORDS, _clean, _pieces
from pcgtts.recipes.demo.train_draft import (
    DraftShape,
    distill,
    draft_from_target,
    narrow_draft,
    project_draft,
    prune_draft,
)
from pcgtts.recipes.demo.train_lm import ModelSize, TrainConfig

VOCAB = DemoVocab(phonemes=tuple(f"p{i}" for i in range(10)), codebook_size=32)


def _utts(n: int = 40, seed: int = 0) -> Utterances:
    rng = np.random.default_rng(seed)
    ph, st, co = [], [], []
    for _ in range(n):
        frames = int(rng.integers(20, 60))
        k = int(rng.integers(3, 8))
        ph.append((16 + rng.integers(0, 10, k)).tolist())
        st.append(np.sort(rng.integers(0, frames, k)))
        co.append(rng.integers(0, 32, frames))
    return Utterances(ph, st, co, rng.integers(0, 4, n))


def test_pieces_are_speakable_clauses():
    text = ("And the earth was without form, and void; and darkness was upon the face of the deep, and the "
            "spirit of the lord moved upon the face of the waters, and it was good and very good indeed.")
    pieces = [c for c in (_clean(p) for p in _pieces(text)) if c]
    assert pieces and all(MIN_WORDS <= len(p.split()) <= MAX_WORDS for p in pieces)
    assert all(p[0].isupper() and p[-1] in ".?!" for p in pieces)
    assert _clean("Visit http://x.org now please") is None  # symbols outside plain text are refused


def test_example_masks_the_prompt_and_corrupts_only_target_codes():
    utts = _utts()
    clean, labels = example(VOCAB, utts, 0, 1, np.random.default_rng(0), corrupt=False)
    noisy, labels2 = example(VOCAB, utts, 0, 1, np.random.default_rng(0), corrupt=True)
    assert labels == labels2 and len(clean) == len(noisy) == len(labels)
    start = clean.index(SPEECH)  # inputs up to <speech> are prompt; labels start predicting there
    assert all(y == IGNORE for y in labels[:start]) and labels[start] == utts.phoneme_ids[0][0]
    assert labels[-1] == END
    assert clean[:start + 1] == noisy[:start + 1]  # the reference and text are never corrupted
    changed = [i for i, (a, b) in enumerate(zip(clean, noisy, strict=True)) if a != b]
    assert all(clean[i] >= VOCAB.code_offset and noisy[i] >= VOCAB.code_offset for i in changed)
    # ~10% of target codes flip; over many examples the rate is close to it
    flips = total = 0
    for i in range(len(utts)):
        a, _ = example(VOCAB, utts, i, None, np.random.default_rng(i), corrupt=False)
        b, _ = example(VOCAB, utts, i, None, np.random.default_rng(i), corrupt=True)
        s = a.index(SPEECH)
        codes = [k for k in range(s, len(a)) if a[k] >= VOCAB.code_offset]
        total += len(codes)
        flips += sum(a[k] != b[k] for k in codes)
    assert 0.06 < flips / total < 0.12  # 10% drawn, 1/32 of draws land on the same code


def test_prompt_holds_reference_codes_of_the_same_speaker():
    utts = _utts()
    plan = BatchPlan(utts, 4, seed=3)
    batch = make_batch(VOCAB, utts, plan, 0)
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape
    ids = plan.batch(0)
    for row, i in enumerate(ids):
        x = batch["input_ids"][row].tolist()
        head = prompt_tokens(VOCAB, None, utts.phoneme_ids[i])
        assert x[:2] == head[:2]


def test_batch_plan_is_deterministic_and_covers_each_epoch_once():
    utts = _utts(48)
    a, b = BatchPlan(utts, 4, seed=7), BatchPlan(utts, 4, seed=7)
    epoch = [a.batch(s) for s in range(a.per_epoch)]
    assert all(np.array_equal(x, b.batch(s)) for s, x in enumerate(epoch))
    assert sorted(np.concatenate(epoch).tolist()) == list(range(48))
    assert not np.array_equal(np.concatenate(epoch), np.concatenate([a.batch(s) for s in range(12, 24)]))
    # resuming at a step gives the batch an uninterrupted run would have seen there
    assert np.array_equal(BatchPlan(utts, 4, seed=7).batch(17), a.batch(17))


def test_schedule_warms_up_holds_then_decays_to_the_floor():
    cfg = TrainConfig(lr=1e-3, warmup_steps=10, max_steps=100, decay_steps=20, min_lr_ratio=0.1)
    lrs = [cfg.lr_at(s) for s in range(100)]
    assert lrs[0] == 1e-4 and lrs[9] == 1e-3 and lrs[79] == 1e-3
    assert all(x >= y for x, y in zip(lrs[80:], lrs[81:], strict=False))
    assert abs(cfg.lr_at(100) - 1e-4) < 1e-12


def test_draft_is_the_targets_first_layer_with_shared_head():
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    size = ModelSize(layers=3, hidden=32, heads=2, intermediate=64)
    target = LlamaForCausalLM(size.config(VOCAB.vocab_size))
    draft = draft_from_target(target, layers=1)
    assert draft.config.num_hidden_layers == 1
    t, d = target.state_dict(), draft.state_dict()
    assert set(d) <= set(t)
    assert all(torch.equal(d[k], t[k]) for k in d)
    assert "model.layers.0.self_attn.q_proj.weight" in d and "model.layers.1.self_attn.q_proj.weight" not in d


SMALL = ModelSize(layers=2, hidden=32, heads=2, intermediate=64)


def test_projected_draft_at_full_width_is_the_source_and_narrower_stays_close():
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    one_layer = ModelSize(layers=1, hidden=32, heads=2, intermediate=64)
    source = LlamaForCausalLM(one_layer.config(VOCAB.vocab_size))
    with torch.no_grad():  # RMSNorm gains away from 1, so folding them in is tested
        for layer in source.model.layers:
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
            layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)
        source.model.norm.weight.uniform_(0.5, 1.5)
    ids = torch.randint(0, VOCAB.vocab_size, (3, 20), generator=torch.Generator().manual_seed(1))
    same = project_draft(source, 32, ids)  # a full basis: a rotation of the residual stream
    assert same.config.hidden_size == 32 and same.config.head_dim == 16
    with torch.no_grad():
        ref = source(ids).logits
        assert torch.allclose(same(ids).logits, ref, atol=1e-4)
        narrow = project_draft(source, 24, ids)
        assert narrow.config.hidden_size == 24 and narrow.config.num_attention_heads == 2
        assert narrow.config.head_dim == 16 and narrow.config.intermediate_size == 64
        kl_narrow = torch.nn.functional.kl_div(narrow(ids).logits.log_softmax(-1), ref.log_softmax(-1),
                                               log_target=True, reduction="batchmean")
        fresh = narrow_draft(source, DraftShape(1, 24, 2, 64))
        kl_fresh = torch.nn.functional.kl_div(fresh(ids).logits.log_softmax(-1), ref.log_softmax(-1),
                                              log_target=True, reduction="batchmean")
    assert kl_narrow < kl_fresh


def test_pruned_draft_drops_the_heads_and_units_without_weight_and_keeps_the_function():
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    size = ModelSize(layers=2, hidden=32, heads=4, intermediate=64)
    source = LlamaForCausalLM(size.config(VOCAB.vocab_size))
    dead_heads, dead_units = [0, 2], torch.randperm(64, generator=torch.Generator().manual_seed(3))[:24]
    with torch.no_grad():
        for layer in source.model.layers:
            for h in dead_heads:  # a head that writes nothing into the stream
                layer.self_attn.v_proj.weight[h * 8:(h + 1) * 8] = 0.0
            layer.mlp.down_proj.weight[:, dead_units] = 0.0  # units that write nothing
    ids = torch.randint(0, VOCAB.vocab_size, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = source(ids).logits
        pruned = prune_draft(source, heads=2, intermediate=40)
        assert (pruned.config.num_attention_heads, pruned.config.num_key_value_heads) == (2, 2)
        assert pruned.config.intermediate_size == 40 and pruned.config.head_dim == 8
        assert torch.allclose(pruned(ids).logits, ref, atol=1e-5)
        kept = prune_draft(source, heads=None, intermediate=None)
        assert torch.equal(kept(ids).logits, ref)
        # dropping a head that does write changes the function
        assert not torch.allclose(prune_draft(source, heads=1, intermediate=None)(ids).logits, ref, atol=1e-3)
    gqa = LlamaForCausalLM(source.config.__class__(**{**source.config.to_dict(), "num_key_value_heads": 2}))
    with pytest.raises(ValueError, match="multi-head"):
        prune_draft(gqa, heads=2, intermediate=None)


def test_draft_shape_parses_and_rejects():
    assert DraftShape.parse("same") == DraftShape(hidden=None)
    assert DraftShape.parse("1x128") == DraftShape(1, 128)
    assert DraftShape.parse("2x96x3x256") == DraftShape(2, 96, 3, 256)
    with pytest.raises(ValueError, match="draft shape"):
        DraftShape.parse("1x2x3")


def test_narrow_draft_projects_embeddings_and_head_onto_the_targets_top_directions():
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    target = LlamaForCausalLM(SMALL.config(VOCAB.vocab_size))
    draft = narrow_draft(target, DraftShape(1, 16, 2, 40))
    cfg = draft.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.head_dim, cfg.intermediate_size) == (16, 1, 8, 40)
    emb = target.model.embed_tokens.weight.detach()
    head = (target.lm_head.weight * target.model.norm.weight).detach()
    basis = torch.linalg.svd(torch.cat([emb, head]), full_matrices=False).Vh[:16].T  # [32, 16]
    # the projection keeps token geometry in the top directions: Gram matrices agree there
    assert torch.allclose(draft.model.embed_tokens.weight @ draft.model.embed_tokens.weight.T,
                          (emb @ basis) @ (emb @ basis).T, atol=1e-5)
    assert torch.allclose(draft.lm_head.weight, head @ basis, atol=1e-6)
    assert draft(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, VOCAB.vocab_size)


def test_distill_stops_on_its_time_budget_and_resumes(tmp_path):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    target = LlamaForCausalLM(SMALL.config(VOCAB.vocab_size))
    shape = DraftShape(1, 16, 2, 40)
    stopped = distill(target, VOCAB, _utts(), tmp_path, shape=shape, steps=6, batch_size=4, time_budget_min=0)
    state = torch.load(tmp_path / "ckpt.pt", weights_only=False)
    assert state["step"] == 0 and stopped.config.hidden_size == 16
    done = distill(target, VOCAB, _utts(), tmp_path, shape=shape, steps=6, batch_size=4)
    state = torch.load(tmp_path / "ckpt.pt", weights_only=False)
    assert state["step"] == 6 and len(state["history"]) == 6
    again = distill(target, VOCAB, _utts(), tmp_path, shape=shape, steps=6, batch_size=4)  # nothing left
    assert all(torch.equal(a, b) for a, b in zip(done.state_dict().values(), again.state_dict().values(),
                                                 strict=True))


def test_duration_caps_are_a_percentile_of_each_phonemes_frames_as_laid_out():
    from pcgtts.engine.speech.demo.layout import phoneme_runs, speech_tokens
    from pcgtts.recipes.demo.durations import duration_caps, phoneme_frames

    utts = _utts(n=200)
    counted: dict[int, list[int]] = {}  # frames after each marker, read off the training layout itself
    for pids, starts, codes in zip(utts.phoneme_ids, utts.starts, utts.codes, strict=True):
        for marker, frames in phoneme_runs(VOCAB, speech_tokens(VOCAB, pids, starts, codes)):
            counted.setdefault(marker, []).append(frames)
    frames = phoneme_frames(utts)
    assert {p: sorted(v.tolist()) for p, v in frames.items()} == {p: sorted(v) for p, v in counted.items()}
    caps = duration_caps(VOCAB, utts, percentile=90)
    for pid, v in counted.items():
        cap = caps[VOCAB.phonemes[pid - 16]]
        assert np.mean(np.array(v) <= cap) >= 0.9 and np.mean(np.array(v) <= cap - 1) < 0.9


def test_expected_speedup_is_tokens_per_verify_step_over_the_step_cost():
    from pcgtts.recipes.demo.report import expected_speedup

    assert expected_speedup(1.0, 0.25, 3) == pytest.approx(1 / 1.75)  # drafts wasted: pay for γ of them
    assert expected_speedup(4.0, 0.0, 3) == 4.0  # free draft, all accepted: γ+1 tokens per forward
    assert expected_speedup(1.875, 0.2, 3) == pytest.approx(1.875 / 1.6)


def test_whole_frames_round_phoneme_boundaries_not_each_duration():
    from pcgtts.engine.speech.demo.durations import whole_frames

    frames = torch.tensor([[0.4, 0.4, 0.4, 2.6, 9.0], [1.5, 1.5, 0.0, 0.0, 0.0]])
    valid = torch.tensor([[True] * 4 + [False], [True, True, False, False, False]])
    out = whole_frames(torch.log1p(frames), valid)
    assert out.tolist() == [[0, 1, 0, 3, 0], [2, 1, 0, 0, 0]]  # ends round(0.4, 0.8, 1.2, 3.8) = 0, 1, 1, 4
    assert out.sum(1).tolist() == [4, 3]  # each utterance keeps its rounded total length


def test_duration_model_learns_phoneme_durations_at_the_references_rate(tmp_path):
    """Synthetic corpus: a phoneme's frames = its base duration x its speaker's rate; each speaker's codes
    come from its own band, so the reference clip tells the rate. The model must use both."""
    from pcgtts.engine.speech.demo.durations import DurationConfig
    from pcgtts.recipes.demo.train_durations import duration_errors, train_durations

    rng = np.random.default_rng(0)
    base, rate = rng.integers(1, 6, 10), np.array([1, 2, 3])
    def corpus(n):
        ph, st, co, spk = [], [], [], []
        for _ in range(n):
            s, pids = int(rng.integers(0, 3)), rng.integers(0, 10, int(rng.integers(4, 9)))
            frames = base[pids] * rate[s]
            ph.append((16 + pids).tolist())
            st.append(np.concatenate([[0], np.cumsum(frames)[:-1]]))
            co.append(s * 10 + rng.integers(0, 10, int(frames.sum())))
            spk.append(s)
        return Utterances(ph, st, co, np.array(spk))
    train, val = corpus(300), corpus(60)
    config = DurationConfig(codebook_size=32, dim=32, layers=2, heads=2)
    model = train_durations(train, val, 32, tmp_path, steps=500, batch_size=16, lr=3e-3, config=config)
    errors = duration_errors(model, val)
    per_phoneme_mean = np.mean(base * rate.mean())  # a rate-blind model's typical error scale
    assert errors["frames_mae"] < 0.15 * per_phoneme_mean and errors["length_error_median"] < 0.1
    assert (tmp_path / "model.safetensors").exists()


def test_warmup_linear_decay_warms_up_decays_and_holds_its_floor():
    from pcgtts.recipes.demo.optim import warmup_linear_decay

    lrs = [warmup_linear_decay(s, 100, 1.0, warmup=10, floor=0.2) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(0.91)  # warm-up, already decaying
    assert all(a >= b for a, b in zip(lrs[9:-1], lrs[10:], strict=True))  # then never rises
    assert min(lrs[9:]) == pytest.approx(0.2) and lrs[80:] == pytest.approx([0.2] * 20)  # held at the floor


def test_feature_head_learns_the_targets_next_distribution_and_resumes(tmp_path):
    """The head's unrolled KL falls with training (it learns to step the target's state), an interrupted run
    resumes where it stopped, and the held-out acceptance per draft step is a probability."""
    from pcgtts.recipes.demo.train_draft_head import held_out_acceptance_by_step, train_head
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    target = LlamaForCausalLM(SMALL.config(VOCAB.vocab_size)).eval()
    kw = dict(inner=32, unroll=2, batch_size=4, lr=1e-2)
    train_head(target, VOCAB, _utts(), tmp_path, steps=40, time_budget_min=0, **kw)
    assert torch.load(tmp_path / "ckpt.pt", weights_only=False)["step"] == 0
    head = train_head(target, VOCAB, _utts(), tmp_path, steps=40, **kw)
    history = torch.load(tmp_path / "ckpt.pt", weights_only=False)["history"]
    assert len(history) == 40
    first, last = np.mean([h["kl"] for h in history[:5]], 0), np.mean([h["kl"] for h in history[-5:]], 0)
    assert (last < 0.8 * first).all(), (first, last)  # both unrolled steps improved
    alphas = held_out_acceptance_by_step(target, head, VOCAB, _utts(n=8, seed=1), steps=2, count=8)
    assert len(alphas) == 2 and all(0 < a <= 1 for a in alphas)


def _own_samples(target, n: int, prompt_len: int = 6, new: int = 24, seed: int = 0) -> list[dict]:
    """n sequences the target sampled itself (T=1) after random prompts, as self_distill stores them."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB.vocab_size, (n, prompt_len), generator=gen)
    with torch.no_grad():
        for _ in range(new):
            probs = torch.softmax(target(input_ids=ids).logits[:, -1].float(), -1)  # [n, V]
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=gen)], 1)
    return [{"prompt": row[:prompt_len].tolist(), "generated": row[prompt_len:].tolist()} for row in ids]


def test_head_fine_tuned_on_the_targets_own_samples_starts_from_its_export_and_gains_on_them(tmp_path):
    """Stage self_distill's parts: a sequence's loss reads only its generated tokens, an exported head loads
    back as it was (to fp16 rounding), and fine-tuning it on the target's own samples (the sequence batches,
    from that export) raises its held-out acceptance on such samples at every draft step."""
    from pcgtts.recipes.demo.self_distill import held_out_alpha_by_step, sequence_batches, sequence_pair
    from pcgtts.recipes.demo.train_draft_head import export_head, load_head, train_head
    from transformers import LlamaForCausalLM

    inputs, labels = sequence_pair({"prompt": [5, 6, 7], "generated": [8, 9, 10]})
    assert inputs == [5, 6, 7, 8, 9] and labels == [IGNORE, IGNORE, 8, 9, 10]  # labels[i]: the token after i

    torch.manual_seed(0)
    target = LlamaForCausalLM(SMALL.config(VOCAB.vocab_size)).eval()
    kw = dict(inner=32, unroll=2, batch_size=4, lr=1e-2)
    head = train_head(target, VOCAB, _utts(), tmp_path / "corpus", steps=10, **kw)
    export_head(head, tmp_path / "export")
    loaded = load_head(tmp_path / "export", target)
    for name, value in head.state_dict().items():
        assert torch.allclose(loaded.state_dict()[name], value, atol=1e-2, rtol=1e-3), name

    rows = _own_samples(target, 72)
    train, held = rows[:48], rows[48:]
    batches = sequence_batches(train, 4, seed=0)
    assert torch.equal(batches(3)["input_ids"], sequence_batches(train, 4, seed=0)(3)["input_ids"])
    before = held_out_alpha_by_step(target, loaded, held, steps=2, temperature=1.0)
    tuned = train_head(target, None, None, tmp_path / "sd", steps=60, lr=1e-2, unroll=2,
                       init=tmp_path / "export", batches=batches)
    after = held_out_alpha_by_step(target, tuned, held, steps=2, temperature=1.0)
    assert all(0 < b < a <= 1 for b, a in zip(before, after, strict=True)), (before, after)
