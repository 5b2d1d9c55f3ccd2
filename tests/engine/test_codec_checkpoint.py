"""StreamingDecoder.checkpoint's default (used by X-codec2's windowed decoder): restoring gives back the
decoder's state, and the codec it decodes with (held as a bound method) is shared, never copied."""

from __future__ import annotations

import numpy as np
from pcgtts.engine.codec.base import Codec
from pcgtts.engine.codec.xcodec2 import WindowedStreamingDecoder


class RepeatCodec(Codec):
    """Each code -> `hop` samples of its value; `weights` stands for a model that must not be copied."""

    sample_rate, frame_rate, hop = 16000, 50, 320

    def __init__(self):
        self.weights = np.zeros(1_000_000, np.float32)

    @classmethod
    def from_dir(cls, path):
        return cls()

    def encode(self, audio, sample_rate):
        raise NotImplementedError

    def decode(self, codes):
        return np.repeat(np.asarray(codes, np.float32), self.hop)

    def streaming_decoder(self):
        return WindowedStreamingDecoder(self.decode, self.hop, chunk=10, context=10, lookahead=5)


def test_default_checkpoint_restores_the_decoder_and_shares_the_codec():
    codec = RepeatCodec()
    codes = np.arange(1, 61)
    alone = codec.streaming_decoder()
    expected = np.concatenate([alone.push(codes[:20]), alone.push(codes[20:]), alone.flush()])

    decoder = codec.streaming_decoder()
    first = decoder.push(codes[:20])
    restore = decoder.checkpoint()
    decoder.push(np.full(40, 999))  # a call whose result is thrown away (a failed batch)
    restore()
    assert decoder.decode.__self__ is codec  # the restored state decodes with the very same codec
    got = np.concatenate([first, decoder.push(codes[20:]), decoder.flush()])
    np.testing.assert_array_equal(got, expected)
