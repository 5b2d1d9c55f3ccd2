"""Token layout of the demo phoneme model: the vocabulary and how prompts and speech are laid out.

Used unchanged by the training recipe and at serving time. One sequence reads::

    <bos> <ref> c(ref)... <text> p_1 ... p_N <speech> p_1 c c c p_2 c c ... p_N c c <end>
    '-------------------- prompt --------------------'  '--------- generated ----------'

The voice is a reference clip given as plain codec codes (no transcript or alignment is needed, so any
clip can be a voice); the text is the whole phoneme sequence; the generated part interleaves each phoneme's
marker token (the same id as the phoneme) before that phoneme's frames, ending with <end>.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PAD, BOS, END, TEXT, SPEECH, REF, UNK = range(7)
SPECIAL_NAMES = ["<pad>", "<bos>", "<end>", "<text>", "<speech>", "<ref>", "<unk>"]
PHONEME_OFFSET = 16  # ids 7..15 are reserved
MAX_PHONEMES = 160  # phoneme slots; the inventory in use is smaller, unused slots never occur
MAX_REF_FRAMES = 100  # longest reference clip (2 s) in the prompt


@dataclass(frozen=True)
class DemoVocab:
    phonemes: tuple[str, ...]  # espeak-ng phoneme mnemonics, id = PHONEME_OFFSET + index
    codebook_size: int

    @property
    def code_offset(self) -> int:
        return PHONEME_OFFSET + MAX_PHONEMES

    @property
    def vocab_size(self) -> int:
        return self.code_offset + self.codebook_size

    @property
    def marker_ids(self) -> range:
        return range(PHONEME_OFFSET, PHONEME_OFFSET + MAX_PHONEMES)

    def phoneme_ids(self, phonemes: list[str]) -> list[int]:
        """Phoneme mnemonics -> ids; phonemes outside the inventory are dropped (never seen in training)."""
        index = {p: PHONEME_OFFSET + i for i, p in enumerate(self.phonemes)}
        return [index[p] for p in phonemes if p in index]

    def code_tokens(self, codes: np.ndarray) -> list[int]:
        return (np.asarray(codes, dtype=np.int64) + self.code_offset).tolist()

    def codes_of(self, tokens) -> np.ndarray:
        t = np.asarray(list(tokens), dtype=np.int64)
        return t[(t >= self.code_offset) & (t < self.vocab_size)] - self.code_offset

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"phonemes": list(self.phonemes), "codebook_size": self.codebook_size,
                                    "phoneme_offset": PHONEME_OFFSET, "max_phonemes": MAX_PHONEMES,
                                    "code_offset": self.code_offset, "specials": SPECIAL_NAMES}, indent=1))

    @classmethod
    def load(cls, path: Path) -> DemoVocab:
        spec = json.loads(Path(path).read_text())
        if spec["phoneme_offset"] != PHONEME_OFFSET or spec["max_phonemes"] != MAX_PHONEMES:
            raise ValueError(f"{path}: vocabulary layout differs from this code's")
        return cls(phonemes=tuple(spec["phonemes"]), codebook_size=int(spec["codebook_size"]))


def prompt_tokens(vocab: DemoVocab, ref_codes: np.ndarray | None, phoneme_ids: list[int]) -> list[int]:
    """<bos> <ref> ref codes <text> phonemes <speech>; ref_codes is cropped to MAX_REF_FRAMES."""
    ref = [] if ref_codes is None else vocab.code_tokens(np.asarray(ref_codes)[:MAX_REF_FRAMES])
    return [BOS, REF, *ref, TEXT, *phoneme_ids, SPEECH]


def speech_tokens(vocab: DemoVocab, phoneme_ids: list[int], starts: np.ndarray,
                  codes: np.ndarray) -> list[int]:
    """The generated part: each phoneme's marker, then the codes of its frames; <end> last.

    starts: int [N] first frame of each phoneme (non-decreasing); frames before starts[1] belong to the
    first phoneme, frames from starts[-1] on to the last.
    """
    bounds = np.append(0, np.cumsum(phoneme_durations(starts, len(codes))))
    code_toks = vocab.code_tokens(codes)
    out: list[int] = []
    for i, pid in enumerate(phoneme_ids):
        out.append(pid)
        out.extend(code_toks[bounds[i]:bounds[i + 1]])
    out.append(END)
    return out


def phoneme_durations(starts: np.ndarray, num_frames: int) -> np.ndarray:
    """int [N] frames each phoneme takes in the layout, from its start frames (non-decreasing, [N]): frames
    before starts[1] belong to the first phoneme, frames from starts[-1] on to the last."""
    bounds = np.append(np.asarray(starts, dtype=np.int64), num_frames)
    bounds[0] = 0
    return np.diff(bounds)


def phoneme_runs(vocab: DemoVocab, tokens) -> list[tuple[int, int]]:
    """Generated speech -> (marker id, frames after it) per marker, in order (speech_tokens read back)."""
    runs: list[tuple[int, int]] = []
    for t in tokens:
        if t in vocab.marker_ids:
            runs.append((t, 0))
        elif t >= vocab.code_offset and runs:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
    return runs
