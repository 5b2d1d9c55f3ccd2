"""The demo phoneme family ("demo-phoneme"): the embedded model's prompt format and constraint.

Text -> espeak-ng phonemes (engine.speech.demo.espeak, the code the corpus was made with) -> prompt of
reference codes + phonemes (engine.speech.demo.layout); generation is constrained by the marker merge
(engine.speech.demo.constraint), each phoneme ending within a window around the duration model's
prediction for that text and voice (engine.speech.demo.durations), or within the corpus's per-phoneme
caps when the bundle has no duration model. Bundle files used: `family.json` (the vocabulary, default
voice, `duration_window` and `max_phoneme_frames`), `duration/` (the duration model) and `voices/` (preset
voices, each `<name>.json` with codes and transcript, and `<name>.wav`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pcgtts.engine.speech.base import SpeechFamily, SpeechPrompt, VoicePrompt
from pcgtts.engine.speech.demo.alignment import MarkerAligner
from pcgtts.engine.speech.demo.constraint import MarkerMergeConstraint
from pcgtts.engine.speech.demo.durations import DurationModel
from pcgtts.engine.speech.demo.espeak import phonemize, phonemize_words
from pcgtts.engine.speech.demo.layout import END, DemoVocab, prompt_tokens

FAMILY_FILE = "family.json"
DURATION_DIR = "duration"
MAX_WORDS_PER_CHUNK = 16  # the model was trained on clauses of 4-14 words


class DemoPhonemeFamily(SpeechFamily):
    name = "demo-phoneme"
    aligns_words = True  # its markers say where each phoneme, so each word, is spoken
    tokens_before_audio = 1  # the constraint forces the first phoneme's marker first

    def __init__(self, vocab: DemoVocab, voices: dict[str, VoicePrompt] | None = None,
                 default_voice: str | None = None, max_phoneme_frames: dict[str, int] | None = None,
                 durations: DurationModel | None = None, duration_window: float = 0.0):
        """max_phoneme_frames: phoneme mnemonic -> most frames it may take (the duration caps, used when
        there is no duration model); durations: predicts each phoneme's frames, and the phoneme then ends
        within ±duration_window (a fraction; 0: exactly at) of its prediction."""
        self.vocab = vocab
        self.voices = voices or {}
        self.default_voice = default_voice or (sorted(self.voices)[0] if self.voices else None)
        caps = max_phoneme_frames or {}
        ids = vocab.phoneme_ids(list(vocab.phonemes))
        self._cap_of_id = {pid: caps[p] for p, pid in zip(vocab.phonemes, ids, strict=True) if p in caps}
        self.durations, self.duration_window = durations, duration_window

    @classmethod
    def from_dir(cls, root: str | Path) -> DemoPhonemeFamily:
        root = Path(root)
        vocab = DemoVocab.load(root / FAMILY_FILE)
        voices = load_voices(root / "voices") if (root / "voices").is_dir() else {}
        spec = json.loads((root / FAMILY_FILE).read_text())
        durations = DurationModel.load(root / DURATION_DIR) if (root / DURATION_DIR).is_dir() else None
        return cls(vocab, voices, spec.get("default_voice"), spec.get("max_phoneme_frames"), durations,
                   spec.get("duration_window", 0.0))

    def constraint(self, phonemes: list[int], voice: VoicePrompt | None,
                   durations: bool = True) -> MarkerMergeConstraint:
        """The decode constraint for `phonemes` spoken in `voice`: duration windows around the duration
        model's predictions, else (or with durations False) the corpus caps."""
        if self.durations is None or not durations:
            return MarkerMergeConstraint(self.vocab, phonemes, [self._cap_of_id.get(p) for p in phonemes])
        frames = self.durations.predict(phonemes, None if voice is None else voice.codes)
        w = self.duration_window
        return MarkerMergeConstraint(self.vocab, phonemes, [math.ceil(n * (1 + w)) for n in frames],
                                     [math.floor(n * (1 - w)) for n in frames])

    @property
    def stop_token_ids(self) -> list[int]:
        return [END]

    def phoneme_ids(self, text: str) -> list[int]:
        return self.vocab.phoneme_ids(phonemize(text))

    def build_prompt(self, text: str, voice: VoicePrompt | None) -> SpeechPrompt:
        """voice None -> the bundle's default preset voice (or no reference if it has none)."""
        if voice is None and self.default_voice is not None:
            voice = self.voices[self.default_voice]
        mnemonics, word_of, words = phonemize_words(text)
        known = set(self.vocab.phonemes)
        kept = [(p, w) for p, w in zip(mnemonics, word_of, strict=True) if p in known]
        phonemes = self.vocab.phoneme_ids([p for p, _ in kept])
        if not phonemes:
            raise ValueError(f"no speakable phonemes in {text!r}")
        ids = prompt_tokens(self.vocab, None if voice is None else voice.codes, phonemes)
        return SpeechPrompt(token_ids=ids, stop_token_ids=self.stop_token_ids,
                            constraint=self.constraint(phonemes, voice),
                            word_aligner=MarkerAligner(self.vocab, words, [w for _, w in kept]))

    def tokens_to_codes(self, token_ids: Sequence[int]) -> np.ndarray:
        return self.vocab.codes_of(token_ids)

    def codes_to_tokens(self, codes: np.ndarray) -> list[int]:
        return self.vocab.code_tokens(codes)

    def preset_voices(self) -> dict[str, VoicePrompt]:
        names = sorted(self.voices, key=lambda n: (n != self.default_voice, n))  # the default first
        return {name: self.voices[name] for name in names}

    @staticmethod
    def split_sentence(sentence: str) -> list[str]:
        """One sentence -> clause-sized chunks to synthesise one after another: at most
        MAX_WORDS_PER_CHUNK words, cut after a comma once the chunk has 6 words, and after a semicolon or
        colon. Chunks without a letter or digit are dropped."""
        chunks: list[str] = []
        words: list[str] = []
        for word in sentence.split():
            words.append(word)
            if (len(words) >= MAX_WORDS_PER_CHUNK or word.endswith((";", ":"))
                    or (word.endswith(",") and len(words) >= 6)):
                chunks.append(" ".join(words))
                words = []
        if words:
            chunks.append(" ".join(words))
        return [c for c in chunks if re.search(r"[A-Za-z0-9]", c)]


def load_voices(voices_dir: Path) -> dict[str, VoicePrompt]:
    """Preset voices: `<name>.json` files with `codes` (list of ints) and `transcript`."""
    voices = {}
    for path in sorted(Path(voices_dir).glob("*.json")):
        spec = json.loads(path.read_text())
        voices[path.stem] = VoicePrompt(codes=np.asarray(spec["codes"], dtype=np.int64),
                                        transcript=spec["transcript"])
    return voices
