"""Codec decode cost, this build against the previous one (a77ce58), side by side in one process.

The previous build decoded the windows of one length in one conv-decoder call and ran Griffin-Lim's FFTs
and phase normalisation (torch.sgn) over the batch; this build decodes window by window and runs those
block by block (`griffinlim.each_block`; a stream's audio is then the same bits in any batch). The first
two runs in the .txt predate the per-block FFTs (only torch.sgn went block by block then); the last one
has them. The previous form is restated here to time
both on the same machine at the same moment, alternating, 5 repeats, medians.

    .venv/bin/python bench/results/determinism/codec_side_by_side.py 1 8 16 \
        > bench/results/determinism/codec_side_by_side.txt
"""

import statistics
import sys
import time

import numpy as np
import torch
from pcgtts.engine.codec.demo import codec as C
from pcgtts.engine.codec.demo import griffinlim as G
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR

torch.set_num_threads(1)
codec = C.DemoMelCodec.from_dir(DEFAULT_MODEL_DIR / "codec")
this_mels, this_each_block = C.DemoMelCodec._block_mels, G.each_block


def previous_mels(self, streams):
    windows = [self.block_window(s) for s in streams]

    def run(group):
        with torch.no_grad():
            mel = self.decoder(torch.as_tensor(np.stack([w[0] for w in group])))
        return [m[skip: skip + n] for m, (_, skip, n) in zip(mel, group, strict=True)]

    return G.batched_by(lambda w: len(w[0]), windows, run)


def use(previous: bool) -> None:
    C.DemoMelCodec._block_mels = previous_mels if previous else this_mels
    G.each_block = (lambda op, batch: op(batch)) if previous else this_each_block


def decode_all(n_streams: int, seconds: float = 4.0, step: int = 3) -> float:
    """n streams of random codes fed `step` codes per call (as the TTS service feeds them), then flushed."""
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, codec.codebook_size, int(50 * seconds)) for _ in range(n_streams)]
    streams = [codec.streaming_decoder() for _ in seqs]
    start = time.perf_counter()
    for pos in range(0, len(seqs[0]), step):
        codec.decode_streams([(st, s[pos:pos + step]) for st, s in zip(streams, seqs, strict=True)])
    codec.decode_streams([(st, None) for st in streams])
    return time.perf_counter() - start


for n in [int(x) for x in sys.argv[1:]] or [1, 8, 16]:
    times = {True: [], False: []}
    for _ in range(5):
        for previous in (True, False):
            use(previous)
            times[previous].append(decode_all(n))
    old, new = statistics.median(times[True]), statistics.median(times[False])
    runs = [[round(x, 3) for x in times[previous]] for previous in (True, False)]
    print(f"{n} streams x 4 s of audio: previous build {old:.3f} s, this build {new:.3f} s of codec time, "
          f"ratio {new / old:.2f} (runs {runs[0]} / {runs[1]})")
