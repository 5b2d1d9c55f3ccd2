"""libespeak-ng through ctypes: speech audio plus per-phoneme timings, and text -> phonemes.

One module serves both the training recipe (corpus audio with phoneme alignments) and the serving-time
text front end (phonemes of the text to speak): the phoneme sequence is read from the same phoneme
events in both, so training and serving see identical phonemes. libespeak-ng holds global state and is
not thread-safe, so every call goes through one process-wide lock.
"""

from __future__ import annotations

import ctypes
import re
import threading
from dataclasses import dataclass

import numpy as np

ESPEAK_RATE = 22050  # Hz of the audio libespeak-ng produces for its standard voices

# Constants from espeak-ng's speak_lib.h.
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_PHONEME_EVENTS = 0x0001
_INITIALIZE_DONT_EXIT = 0x8000
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_EVENT_LIST_TERMINATED = 0
_EVENT_PHONEME = 7
_PARAM_RATE = 1
_PARAM_PITCH = 3
_PARAM_RANGE = 4

# The front-end voice: phonemes do not depend on the variant, rate or pitch (only on the language), so
# every speaker of the corpus is an `en-us` variant and the front end phonemises with plain `en-us`.
FRONT_END_VOICE = "en-us"


class _EventId(ctypes.Union):
    _fields_ = [("number", ctypes.c_int), ("name", ctypes.c_char_p), ("string", ctypes.c_char * 8)]


class _Event(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", _EventId),
    ]


_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                             ctypes.POINTER(_Event))


@dataclass(frozen=True)
class Voice:
    """An espeak-ng voice setting; one corpus 'speaker'."""

    name: str = FRONT_END_VOICE  # e.g. "en-us+m3"
    rate: int = 175  # words per minute
    pitch: int = 50  # 0-100
    pitch_range: int = 50  # 0-100

    @property
    def key(self) -> str:
        return f"{self.name}_r{self.rate}_p{self.pitch}_g{self.pitch_range}"


@dataclass
class Utterance:
    audio: np.ndarray  # float32 [samples] at ESPEAK_RATE
    phonemes: list[str]  # espeak phoneme mnemonics, in order
    starts: np.ndarray  # int [len(phonemes)] start sample of each phoneme at ESPEAK_RATE
    # int [len(phonemes)] where in the text each phoneme comes from: the 1-based character position of
    # its word (of the punctuation or space for a pause)
    positions: np.ndarray | None = None


class _Espeak:
    """The loaded library; use through `synthesize` / `phonemize`."""

    def __init__(self) -> None:
        import espeakng_loader

        self.lib = ctypes.CDLL(espeakng_loader.get_library_path())
        data_dir = espeakng_loader.get_data_path()
        self.lib.espeak_Initialize.restype = ctypes.c_int
        self.lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        self.lib.espeak_ng_InitializePath.argtypes = [ctypes.c_char_p]
        self.lib.espeak_ng_InitializePath(data_dir.encode())
        rate = self.lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data_dir.encode(),
                                          _INITIALIZE_PHONEME_EVENTS | _INITIALIZE_DONT_EXIT)
        if rate != ESPEAK_RATE:
            raise RuntimeError(f"libespeak-ng initialised at {rate} Hz, expected {ESPEAK_RATE}")
        self.lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        self.lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self.lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
                                          ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        self._chunks: list[np.ndarray] = []
        self._events: list[tuple[str, int, int]] = []
        self._callback = _CALLBACK(self._on_audio)  # kept referenced for the library's lifetime
        self.lib.espeak_SetSynthCallback(self._callback)
        self.lock = threading.Lock()
        self._voice: Voice | None = None

    def _on_audio(self, wav, numsamples, events) -> int:
        if numsamples > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(numsamples,)).copy())
        i = 0
        while events[i].type != _EVENT_LIST_TERMINATED:
            if events[i].type == _EVENT_PHONEME:
                event = events[i]
                self._events.append((event.id.string.decode("utf-8", "replace"), event.sample,
                                     event.text_position))
            i += 1
        return 0

    def _set_voice(self, voice: Voice) -> None:
        if voice == self._voice:
            return
        if self.lib.espeak_SetVoiceByName(voice.name.encode()) != 0:
            raise ValueError(f"unknown espeak-ng voice {voice.name!r}")
        self.lib.espeak_SetParameter(_PARAM_RATE, voice.rate, 0)
        self.lib.espeak_SetParameter(_PARAM_PITCH, voice.pitch, 0)
        self.lib.espeak_SetParameter(_PARAM_RANGE, voice.pitch_range, 0)
        self._voice = voice

    def synthesize(self, text: str, voice: Voice) -> Utterance:
        with self.lock:
            self._set_voice(voice)
            self._chunks, self._events = [], []
            data = text.encode("utf-8") + b"\0"
            status = self.lib.espeak_Synth(data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
            if status != 0:
                raise RuntimeError(f"espeak_Synth failed with status {status}")
            pcm = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)
            events = self._events
        audio = pcm.astype(np.float32) / 32768.0
        phonemes = [p for p, _, _ in events]
        starts = np.array([s for _, s, _ in events], dtype=np.int64)
        positions = np.array([t for _, _, t in events], dtype=np.int64)
        return Utterance(audio=audio, phonemes=phonemes, starts=starts, positions=positions)


_instance: _Espeak | None = None
_instance_lock = threading.Lock()


def _espeak() -> _Espeak:
    global _instance
    with _instance_lock:
        if _instance is None:
            _instance = _Espeak()
        return _instance


def synthesize(text: str, voice: Voice = Voice()) -> Utterance:
    """Speak `text` with `voice`; returns the audio and each phoneme's start sample."""
    return _espeak().synthesize(text, voice)


def phonemize(text: str) -> list[str]:
    """The front end's phoneme sequence for `text` (the phoneme events of the front-end voice)."""
    return synthesize(text, Voice()).phonemes


def phonemize_words(text: str) -> tuple[list[str], list[int | None], list[str]]:
    """`phonemize(text)` with the word each phoneme speaks: (phonemes, word index of each, or None for a
    pause, the words: `text`'s whitespace-separated tokens, in order). A phoneme belongs to the token
    holding its event's text position (a number read as several words belongs to its one token)."""
    utterance = synthesize(text, Voice())
    spans = [m.span() for m in re.finditer(r"\S+", text)]
    token_at = {}
    for index, (start, end) in enumerate(spans):
        token_at.update(dict.fromkeys(range(start, end), index))
    words_of = [None if p.startswith("_") else token_at.get(int(pos) - 1)
                for p, pos in zip(utterance.phonemes, utterance.positions, strict=True)]
    return utterance.phonemes, words_of, [text[a:b] for a, b in spans]
