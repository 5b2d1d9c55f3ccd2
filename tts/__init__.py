"""The TTS service layer: text + voice -> audio, using the engine, a speech family and a codec.

The server and the `pcgtts synth` CLI use only what this module exports; one request is one
`TTSService.synthesize` call, whose `Synthesis` streams the audio.

    service.py      TTSService (loads a bundle, starts the engine) and TTSConfig
    synthesis.py    one request: its segments generated one after another, streamed as audio chunks
    decode_pool.py  the codec threads, batched across streams
    codec_process.py  the codec in a child process of its own (no shared interpreter lock with the engine)
    text.py         where sentences end (whole inputs and text still arriving), and cutting them into segments
    feed.py         TextFeed: an utterance's text while it still arrives, spoken sentence by sentence
    bundle.py       a model bundle's manifest: family, codec, target/draft, ASG tables, voices
    errors.py       the service's exceptions
    cli.py          `pcgtts synth`
"""

from pcgtts.engine.codec.base import EncoderUnavailable
from pcgtts.engine.speech.base import VoicePrompt
from pcgtts.tts.decode_pool import CodecStats
from pcgtts.tts.errors import (
    InputTooLong,
    InvalidOptions,
    NothingToSay,
    ServiceOverloaded,
    ServiceUnavailable,
    SynthesisFailed,
)
from pcgtts.tts.feed import TextFeed
from pcgtts.tts.service import TTSConfig, TTSService
from pcgtts.tts.synthesis import ReferenceClip, Synthesis, SynthesisOptions, SynthesisStats, WordTiming

__all__ = ["CodecStats", "EncoderUnavailable", "InputTooLong", "InvalidOptions", "NothingToSay",
           "ReferenceClip", "ServiceOverloaded", "ServiceUnavailable", "Synthesis", "SynthesisFailed",
           "SynthesisOptions", "SynthesisStats", "TTSConfig", "TTSService", "TextFeed", "VoicePrompt",
           "WordTiming"]
