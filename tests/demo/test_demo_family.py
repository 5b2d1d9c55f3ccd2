"""The demo phoneme family: front end, prompt layout, token <-> code map and the marker-merge constraint."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from pcgtts.engine.speech.base import DraftedHistories, VoicePrompt
from pcgtts.engine.speech.demo.constraint import MarkerMergeConstraint
from pcgtts.engine.speech.demo.espeak import Voice, phonemize, synthesize
from pcgtts.engine.speech.demo.family import DemoPhonemeFamily
from pcgtts.engine.speech.demo.layout import (
    BOS,
    END,
    MAX_REF_FRAMES,
    REF,
    SPEECH,
    TEXT,
    DemoVocab,
    phoneme_runs,
    prompt_tokens,
    speech_tokens,
)

VOCAB = DemoVocab(phonemes=("@", "I", "_", "d", "h", "l", "oU", "w", "3:"), codebook_size=64)


def test_front_end_is_deterministic_and_voice_independent():
    text = "Rice is often served in round bowls."
    first = phonemize(text)
    assert first == phonemize(text)
    assert len(first) > 15
    # corpus speakers vary variant, rate and pitch; their phonemes must equal the front end's
    assert synthesize(text, Voice("en-us+f2", rate=200, pitch=75)).phonemes == first


def test_synthesis_timings_are_ordered_and_inside_the_audio():
    utt = synthesize("Hello world.", Voice("en-us+m3"))
    assert len(utt.phonemes) == len(utt.starts) > 4
    assert np.all(np.diff(utt.starts) >= 0)
    assert 0 <= utt.starts[0] and utt.starts[-1] <= len(utt.audio)


def test_prompt_layout_crops_the_reference():
    codes = np.arange(MAX_REF_FRAMES + 30) % 64
    ids = prompt_tokens(VOCAB, codes, [16, 17])
    assert ids[:2] == [BOS, REF]
    assert ids[2:2 + MAX_REF_FRAMES] == VOCAB.code_tokens(codes[:MAX_REF_FRAMES])
    assert ids[2 + MAX_REF_FRAMES:] == [TEXT, 16, 17, SPEECH]
    assert prompt_tokens(VOCAB, None, [16]) == [BOS, REF, TEXT, 16, SPEECH]


def test_speech_layout_interleaves_markers_before_their_frames():
    codes = np.array([5, 6, 7, 8, 9])
    toks = speech_tokens(VOCAB, [16, 17, 18], np.array([1, 3, 3]), codes)
    off = VOCAB.code_offset
    # frames before the second phoneme's start go to the first phoneme; an empty phoneme keeps its marker
    assert toks == [16, off + 5, off + 6, off + 7, 17, 18, off + 8, off + 9, END]
    assert VOCAB.codes_of(toks).tolist() == codes.tolist()


def _probs(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits.double(), dim=-1)


def test_marker_merge_moves_all_marker_mass_to_the_expected_marker():
    gen = torch.Generator().manual_seed(0)
    expected = [20, 16, 20]
    constraint = MarkerMergeConstraint(VOCAB, expected)
    logits = torch.randn(3, VOCAB.vocab_size, generator=gen)
    off = VOCAB.code_offset
    histories = [[20, off + 1], [20, off + 1, 16, off + 2, off + 3], [20, 16, 20, off]]
    out = constraint.apply(logits.clone(), histories)
    markers = list(VOCAB.marker_ids) + [END]
    # specials that never occur in generated speech are masked: compare with p renormalised without them
    allowed = torch.zeros(VOCAB.vocab_size, dtype=torch.bool)
    allowed[markers] = True
    allowed[off:] = True
    p, q = _probs(logits.masked_fill(~allowed, float("-inf"))), _probs(out)
    for row, nxt in enumerate([16, 20, END]):
        assert q[row, nxt].item() == pytest.approx(p[row, markers].sum().item(), rel=1e-6)
        others = [m for m in markers if m != nxt]
        assert q[row, others].sum().item() == 0.0
        # the codes keep their probabilities: the model still decides WHEN to advance
        assert torch.allclose(q[row, off:], p[row, off:], rtol=1e-6)
        assert q[row, :16].sum().item() == pytest.approx(q[row, END].item())  # only END among specials


def test_marker_merge_opens_with_the_first_marker():
    constraint = MarkerMergeConstraint(VOCAB, [18, 19])
    out = constraint.apply(torch.zeros(1, VOCAB.vocab_size), [[]])
    q = _probs(out)
    assert q[0, 18].item() == 1.0


def test_marker_merge_is_a_function_of_history_only():
    constraint = MarkerMergeConstraint(VOCAB, [16, 17])
    logits = torch.randn(2, VOCAB.vocab_size, generator=torch.Generator().manual_seed(1))
    hist = [[16, VOCAB.code_offset], [16, VOCAB.code_offset]]
    a = constraint.apply(logits.clone(), hist)
    b = constraint.apply(logits.clone()[[1, 0]], hist)[[1, 0]]
    assert torch.equal(a, b)


def test_family_builds_prompts_with_default_voice_and_maps_tokens():
    voice = VoicePrompt(codes=np.array([1, 2, 3]), transcript="hi")
    family = DemoPhonemeFamily(DemoVocab(phonemes=tuple(sorted(set(phonemize("Hello world.")))),
                                         codebook_size=64), {"amy": voice})
    prompt = family.build_prompt("Hello world.", None)
    assert prompt.token_ids[2:5] == family.codes_to_tokens(voice.codes)
    assert prompt.stop_token_ids == [END]
    n_phonemes = len(phonemize("Hello world."))
    assert prompt.token_ids[-1] == SPEECH and len(prompt.token_ids) == 2 + 3 + 1 + n_phonemes + 1
    assert prompt.constraint.next_marker([]) == prompt.token_ids[6]
    toks = family.codes_to_tokens(np.array([4, 0, 63]))
    assert family.tokens_to_codes([toks[0], 16, toks[1], END, toks[2]]).tolist() == [4, 0, 63]


def test_split_sentence_keeps_every_word_in_clause_sized_chunks():
    sentence = " ".join(f"w{i}" for i in range(40)) + ", end here; and there: done!"
    chunks = DemoPhonemeFamily.split_sentence(sentence)
    assert " ".join(chunks).split() == sentence.split()
    assert all(len(c.split()) <= 16 for c in chunks)
    assert chunks[-4:] == ["w32 w33 w34 w35 w36 w37 w38 w39,", "end here;", "and there:", "done!"]
    assert DemoPhonemeFamily.split_sentence("-- ...") == []  # nothing to say


def test_a_phoneme_at_its_cap_ends_and_the_last_one_ends_speech():
    off = VOCAB.code_offset
    constraint = MarkerMergeConstraint(VOCAB, [16, 17], max_frames=[2, 1])
    logits = torch.randn(4, VOCAB.vocab_size, generator=torch.Generator().manual_seed(2))
    histories = [[16, off + 1], [16, off + 1, off + 2], [16, off, off, 17, off + 3], [16, off, 17]]
    q = _probs(constraint.apply(logits.clone(), histories))
    uncapped = _probs(MarkerMergeConstraint(VOCAB, [16, 17]).apply(logits.clone(), histories))
    assert torch.equal(q[0], uncapped[0]) and torch.equal(q[3], uncapped[3])  # below the cap: as before
    assert q[1, 17].item() == 1.0  # 2 frames of the first phoneme: its cap, the next marker is forced
    assert q[2, END].item() == 1.0  # the last phoneme at its cap ends the utterance
    assert constraint.position(histories[2]) == (2, 1)


def test_capped_sampling_never_exceeds_a_cap_and_always_ends():
    gen = torch.Generator().manual_seed(3)
    expected, caps = [16, 17, 18, 19], [3, None, 0, 2]
    constraint = MarkerMergeConstraint(VOCAB, expected, max_frames=caps)
    bias = torch.zeros(VOCAB.vocab_size)
    bias[VOCAB.code_offset:] = 4.0  # the model would rather keep speaking than advance
    for _ in range(200):
        history: list[int] = []
        while not history or history[-1] != END:
            logits = constraint.apply(torch.randn(1, VOCAB.vocab_size, generator=gen) + bias, [history])
            history.append(int(torch.multinomial(torch.softmax(logits[0], -1), 1, generator=gen)))
            assert len(history) < 200
        assert [t for t in history if t < VOCAB.code_offset] == expected + [END]
        for (_, frames), cap in zip(phoneme_runs(VOCAB, history), caps, strict=True):
            assert cap is None or frames <= cap
    with pytest.raises(ValueError):
        MarkerMergeConstraint(VOCAB, expected, max_frames=[1])


def test_family_reads_duration_caps_by_phoneme(tmp_path):
    import json

    vocab = DemoVocab(phonemes=tuple(sorted(set(phonemize("Hello world.")))), codebook_size=64)
    vocab.save(tmp_path / "family.json")
    spec = json.loads((tmp_path / "family.json").read_text())
    caps = {p: 3 + i for i, p in enumerate(vocab.phonemes[:-1])}  # the last phoneme has no cap
    (tmp_path / "family.json").write_text(json.dumps({**spec, "max_phoneme_frames": caps}))
    family = DemoPhonemeFamily.from_dir(tmp_path)
    prompt = family.build_prompt("Hello world.", None)
    assert prompt.constraint.max_frames == [caps.get(p) for p in phonemize("Hello world.")]
    assert DemoPhonemeFamily(vocab).build_prompt("Hello world.", None).constraint.max_frames == \
        [None] * len(phonemize("Hello world."))


def test_constraint_memo_gives_the_same_positions_as_a_full_scan():
    # a request's calls as the engine makes them: committed output + 0..k drafts, drafts sometimes rejected
    rng = np.random.default_rng(4)
    constraint = MarkerMergeConstraint(VOCAB, [16] * 50, max_frames=[4] * 50)
    fresh = MarkerMergeConstraint(VOCAB, [16] * 50, max_frames=[4] * 50)
    committed: list[int] = []

    def token() -> int:
        return 16 if rng.random() < 0.3 else VOCAB.code_offset + int(rng.integers(0, 64))

    for _ in range(60):
        drafts = [token() for _ in range(3)]
        for k in range(3):
            constraint.apply(torch.zeros(1, VOCAB.vocab_size), [committed + drafts[:k]])
        histories = [committed + drafts[:i] for i in range(4)] + [[token()] + committed]  # one unrelated
        logits = torch.randn(len(histories), VOCAB.vocab_size, generator=torch.Generator().manual_seed(5))
        unmemoised = MarkerMergeConstraint(VOCAB, [16] * 50, max_frames=[4] * 50)  # no earlier calls
        assert torch.equal(constraint.apply(logits.clone(), histories),
                           unmemoised.apply(logits.clone(), histories))
        assert constraint._positions(histories) == [fresh.position(h) for h in histories]
        committed += drafts[:int(rng.integers(0, 4))] + [token()]


def test_the_engines_histories_plan_as_their_lists_do():
    """The engine's DraftedHistories (a request's growing token list, read on from where the last call
    stopped) give what the same histories as lists give a constraint that has never seen them: two requests
    sharing one constraint, calls interleaved, draft calls (one position past k drafts) and verify calls
    (γ + 1 positions), drafts shorter than the positions ask, and the first call before any output."""
    rng = np.random.default_rng(7)
    caps = dict(max_frames=[4] * 50, min_frames=[1] * 50)
    shared = MarkerMergeConstraint(VOCAB, [16] * 50, **caps)
    requests = [[3, 4], [6, 7]]  # prompts; what a request generates is appended to its list
    starts = [2, 2]

    def token() -> int:
        return 16 if rng.random() < 0.3 else VOCAB.code_offset + int(rng.integers(0, 64))

    for step in range(80):
        r = step % 2
        tokens, start = requests[r], starts[r]
        drafts = [token() for _ in range(int(rng.integers(1, 4)))]
        for offset, count in [(k, 1) for k in range(len(drafts))] + [(0, 4)]:
            engine_histories = DraftedHistories(tokens, start, drafts, offset, count)
            lists = [tokens[start:] + drafts[:offset + i] for i in range(count)]
            assert list(engine_histories) == lists and engine_histories.lengths() == [len(h) for h in lists]
            logits = torch.randn(1, count, VOCAB.vocab_size, generator=torch.Generator().manual_seed(step))
            unseen = MarkerMergeConstraint(VOCAB, [16] * 50, **caps)
            assert shared._plan(engine_histories) == unseen._plan(lists)
            assert torch.equal(MarkerMergeConstraint.apply_rows([shared], logits.clone(), [engine_histories]),
                               unseen.apply(logits[0].clone(), lists)[None])
        tokens += drafts[:int(rng.integers(0, len(drafts) + 1))] + [token()]
    one = DraftedHistories([1, 2, 3], 1, [8, 9], 1, 3)
    assert one[-1] == [2, 3, 8, 9] and one[0:2] == [[2, 3, 8], [2, 3, 8, 9]] and one.generated() == 2
    with pytest.raises(IndexError):
        one[3]


def test_a_batch_of_the_engines_histories_plans_as_each_row_alone():
    """apply_rows over rows of different texts, caps and minimums (their tables stacked, padded to the
    longest), the engine's DraftedHistories with one drafts' width for all rows, draft and verify calls, the
    batch's rows changing between calls: each row as that row's own constraint gives it alone, as lists."""
    rng = np.random.default_rng(11)

    def token() -> int:
        if rng.random() < 0.3:
            return int(rng.choice([16, 17, END]))
        return VOCAB.code_offset + int(rng.integers(64))

    def constraint(k: int) -> MarkerMergeConstraint:
        caps = [None if rng.random() < 0.3 else int(rng.integers(1, 4)) for _ in range(k)]
        return MarkerMergeConstraint(VOCAB, [int(rng.choice([16, 17, 18])) for _ in range(k)],
                                     max_frames=caps, min_frames=[int(rng.integers(0, 3)) for _ in range(k)])

    pool = [constraint(k) for k in (1, 2, 5, 9, 3)]
    outputs = [[int(rng.integers(3, 9)) for _ in range(2)] for _ in pool]  # prompt tokens, then generated
    for step in range(60):
        rows = sorted(rng.choice(len(pool), size=int(rng.integers(1, len(pool) + 1)), replace=False).tolist())
        width = int(rng.integers(0, 5))
        drafts = [[token() for _ in range(width)] for _ in rows]
        for offset, count in [(k, 1) for k in range(width)] + [(0, width + 1)]:
            histories = [DraftedHistories(outputs[r], 2, d, offset, count)
                         for r, d in zip(rows, drafts, strict=True)]
            logits = torch.randn(len(rows), count, VOCAB.vocab_size,
                                 generator=torch.Generator().manual_seed(step))
            batch = MarkerMergeConstraint.apply_rows([pool[r] for r in rows], logits.clone(), histories)
            for i, (r, h) in enumerate(zip(rows, histories, strict=True)):
                alone = copy.deepcopy(pool[r])  # the same bounds, no memo of earlier calls
                alone._read, alone._memo = [], []
                assert torch.equal(batch[i], alone.apply(logits[i].clone(), list(h))), (step, offset, r)
        for r in rows:
            outputs[r] += [token() for _ in range(int(rng.integers(0, 3)))]


def test_phoneme_runs_read_the_speech_layout_back():
    codes = np.array([5, 6, 7, 8, 9])
    toks = speech_tokens(VOCAB, [16, 17, 18], np.array([1, 3, 3]), codes)
    assert phoneme_runs(VOCAB, toks) == [(16, 3), (17, 0), (18, 2)]


def test_a_phoneme_below_its_minimum_goes_on():
    off = VOCAB.code_offset
    constraint = MarkerMergeConstraint(VOCAB, [16, 17], max_frames=[3, 1], min_frames=[2, 1])
    unbounded = MarkerMergeConstraint(VOCAB, [16, 17])
    logits = torch.randn(4, VOCAB.vocab_size, generator=torch.Generator().manual_seed(4))
    histories = [[16, off + 1], [16, off + 1, off + 2], [16, off, off, 17], [16, off, off, 17, off]]
    q = _probs(constraint.apply(logits.clone(), histories))
    free = _probs(unbounded.apply(logits.clone(), histories))
    assert q[0, 17].item() == 0.0  # 1 frame of a 2-frame minimum: the phoneme cannot end yet
    codes = free[0, off:] / free[0, off:].sum()
    assert torch.allclose(q[0, off:], codes)  # ...and the codes keep their relative odds
    assert torch.equal(q[1], free[1])  # at the minimum, below the cap: as without bounds
    assert q[2, END].item() == 0.0 and q[3, END].item() == 1.0  # min 1 = cap 1: exactly one frame
    unbound = constraint.without_caps()
    assert unbound.min_frames == [0, 0] and unbound.max_frames == [None, None]


def test_equal_bounds_give_exact_durations_whatever_the_model_prefers():
    gen = torch.Generator().manual_seed(5)
    expected, frames = [16, 17, 18, 19], [3, 0, 2, 1]
    constraint = MarkerMergeConstraint(VOCAB, expected, max_frames=frames, min_frames=frames)
    for sign in (4.0, -4.0):  # the model would rather keep speaking / rather advance
        bias = torch.zeros(VOCAB.vocab_size)
        bias[VOCAB.code_offset:] = sign
        for _ in range(50):
            history: list[int] = []
            while not history or history[-1] != END:
                logits = constraint.apply(torch.randn(1, VOCAB.vocab_size, generator=gen) + bias, [history])
                history.append(int(torch.multinomial(torch.softmax(logits[0], -1), 1, generator=gen)))
            assert [n for _, n in phoneme_runs(VOCAB, history)] == frames


def test_family_bounds_each_phoneme_by_the_duration_models_window(tmp_path):
    import json

    from pcgtts.engine.speech.demo.durations import DurationConfig, DurationModel

    text = "Hello world."
    vocab = DemoVocab(phonemes=tuple(sorted(set(phonemize(text)))), codebook_size=64)
    vocab.save(tmp_path / "family.json")
    spec = json.loads((tmp_path / "family.json").read_text())
    (tmp_path / "family.json").write_text(json.dumps({**spec, "duration_window": 0.25}))
    torch.manual_seed(0)
    model = DurationModel(DurationConfig(codebook_size=64, dim=16, layers=1, heads=2, log_bias=1.5))
    model.save(tmp_path / "duration")
    family = DemoPhonemeFamily.from_dir(tmp_path)
    voice = VoicePrompt(codes=np.arange(40) % 64, transcript="")
    constraint = family.build_prompt(text, voice).constraint
    frames = model.eval().predict(family.phoneme_ids(text), voice.codes)
    assert sum(frames) > 0 and family.durations.predict(family.phoneme_ids(text), voice.codes) == frames
    assert constraint.min_frames == [math.floor(n * 0.75) for n in frames]
    assert constraint.max_frames == [math.ceil(n * 1.25) for n in frames]


def test_several_requests_constrained_at_once_match_each_alone():
    """apply_rows (the engine's batched call) gives each request what its own apply gives, with forced,
    held and free positions mixed across rows."""
    off = VOCAB.code_offset
    constraints = [MarkerMergeConstraint(VOCAB, [16, 17], max_frames=[2, 1]),
                   MarkerMergeConstraint(VOCAB, [18, 19, 16], min_frames=[0, 3, 0]),
                   MarkerMergeConstraint(VOCAB, [17])]
    histories = [[[16, off + 1], [16, off + 1, off + 2], []],  # free, at its cap (forced), the first marker
                 [[18], [18, 19, off], [18, 19, off, off, off]],  # free, below its minimum (held), free
                 [[17, off], [17, off, off], [17, off, off, off]]]
    logits = torch.randn(3, 3, VOCAB.vocab_size, generator=torch.Generator().manual_seed(5))
    together = MarkerMergeConstraint.apply_rows(constraints, logits.clone(), histories)
    for r, constraint in enumerate(constraints):
        assert torch.equal(together[r], constraint.apply(logits[r].clone(), histories[r]))
    assert _probs(together[0])[1, 17].item() == 1.0 and _probs(together[1])[1, 16].item() == 0.0
