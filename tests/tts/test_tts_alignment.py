"""Word timings (SynthesisOptions.word_timings): the demo family reads them from the markers it generates,
and they are the durations its own duration model gave each phoneme; families that cannot align give none."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from pcgtts.engine.speech.demo.espeak import phonemize_words
from pcgtts.tts import SynthesisOptions
from server_support import wait_idle

# Written for this test, so in no training corpus; two sentences, so two segments joined by a pause.
HELD_OUT = "Seven jugglers wandered past the quiet harbour at dawn. Nobody heard them, humming softly."


def expected_spans(family, segment: str, voice) -> tuple[list[tuple[str, int, int]], int]:
    """(word, first frame, end frame) of each word of `segment` under the family's own duration model, and
    the frames of the whole segment (its pauses too)."""
    mnemonics, word_of, words = phonemize_words(segment)
    kept = [(p, w) for p, w in zip(mnemonics, word_of, strict=True) if p in set(family.vocab.phonemes)]
    frames = family.durations.predict(family.vocab.phoneme_ids([p for p, _ in kept]), voice.codes)
    bounds = np.concatenate([[0], np.cumsum(frames)])  # [P + 1] first frame of each phoneme, then the end
    spans: list[tuple[str, int, int]] = []
    for k, (_, word) in enumerate(kept):
        if word is None:
            continue
        if spans and spans[-1][0] == words[word] and spans[-1][2] == bounds[k]:
            spans[-1] = (words[word], spans[-1][1], int(bounds[k + 1]))
        else:
            spans.append((words[word], int(bounds[k]), int(bounds[k + 1])))
    return [(w.strip(".,"), a, b) for w, a, b in spans], int(bounds[-1])


def test_word_timings_are_the_duration_models_phoneme_durations(tts_service):
    family = tts_service.family
    assert family.aligns_words and tts_service.capabilities()["word_timings"] is True
    # the embedded model ships a duration model and forces each phoneme to end exactly at its prediction
    assert family.durations is not None and family.duration_window == 0
    voice = next(iter(tts_service.preset_voices().values()))

    async def run():
        synth = tts_service.synthesize(HELD_OUT, voice, SynthesisOptions(seed=12, word_timings=True))
        chunks = [c async for c in synth]
        return np.concatenate(chunks), synth.words, synth.take_words()

    audio, words, taken = asyncio.run(run())
    assert taken == words  # nothing was taken before
    segments = tts_service.segments(HELD_OUT)
    assert len(segments) == 2
    per_frame = tts_service.sample_rate // tts_service.codec.frame_rate
    pause = int(tts_service.config.sentence_pause_s * tts_service.sample_rate)
    expected, offset = [], 0
    for segment in segments:
        spans, frames = expected_spans(family, segment, voice)
        expected += [(w, offset + a * per_frame, offset + b * per_frame) for w, a, b in spans]
        offset += frames * per_frame + pause
    assert [w.text for w in words] == HELD_OUT.replace(".", "").replace(",", "").split()
    assert [(w.text, w.start, w.end) for w in words] == expected
    assert all(a.end <= b.start for a, b in zip(words, words[1:], strict=False))  # in order, no overlap
    assert 0 <= words[0].start and words[-1].end <= audio.size == offset - pause
    assert all(w.start < w.end for w in words)
    wait_idle(tts_service)


def test_timings_only_when_asked(tts_service):
    async def run():
        synth = tts_service.synthesize("Quiet, please.", None, SynthesisOptions(seed=1))
        [c async for c in synth]
        return synth.words

    assert asyncio.run(run()) == []


def test_llasa_says_it_cannot_align():
    from pcgtts.engine.speech.llasa import LlasaFamily

    assert LlasaFamily.aligns_words is False


@pytest.mark.parametrize("text", ["Dr. Smith paid $3.50 for it.", "Un café — merci!"])
def test_every_word_with_sounds_gets_its_phonemes(text):
    mnemonics, word_of, words = phonemize_words(text)
    spoken = {w for p, w in zip(mnemonics, word_of, strict=True) if w is not None}
    assert spoken == {i for i, w in enumerate(words) if any(c.isalnum() for c in w)}
    assert all(w is None for p, w in zip(mnemonics, word_of, strict=True) if p.startswith("_"))
