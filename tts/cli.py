"""`pcgtts synth TEXT -o out.wav`: one utterance to a file, through the same TTS service the server uses."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import numpy as np


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("synth", help="synthesise one text to a WAV file")
    parser.add_argument("text")
    parser.add_argument("-o", "--output", type=Path, default=Path("out.wav"))
    parser.add_argument("--model", type=Path, default=None, help="model bundle or Llasa checkpoint dir")
    parser.add_argument("--codec", type=Path, default=None, help="codec dir (X-codec2 for Llasa)")
    parser.add_argument("--voice", default=None, help="preset voice name (default: the first preset)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--temperature", type=float, default=None)
    # None: the service's default (TTSConfig), so that the CLI and the server share one definition
    parser.add_argument("--acceptance", default=None,
                        help="pcg | exact | ssd | topk | lantern | none (default: the service's, pcg)")
    parser.add_argument("--gamma", type=int, default=None, help="draft tokens per step (default: 3)")
    parser.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cpu)")
    parser.set_defaults(func=run)


async def _synthesize(service, text: str, voice, options) -> tuple[np.ndarray, object]:
    synthesis = service.synthesize(text, voice, options)
    chunks = [chunk async for chunk in synthesis]
    return (np.concatenate(chunks) if chunks else np.zeros(0, np.float32)), synthesis.stats


def run(args: argparse.Namespace) -> int:
    import soundfile as sf

    from tts import SynthesisOptions, TTSConfig, TTSService

    given = {"acceptance": args.acceptance, "num_speculative_tokens": args.gamma, "device": args.device,
             "model_dir": args.model}
    config = TTSConfig(codec_dir=args.codec, **{k: v for k, v in given.items() if v is not None})
    service = TTSService.load(config)
    try:
        presets = service.preset_voices()
        if args.voice is not None and args.voice not in presets:
            raise SystemExit(f"unknown voice {args.voice!r}; presets: {', '.join(sorted(presets))}")
        name = args.voice or (sorted(presets)[0] if presets else None)
        voice = presets[name] if name else None
        options = SynthesisOptions(seed=args.seed, temperature=args.temperature, streaming=False)
        audio, stats = asyncio.run(_synthesize(service, args.text, voice, options))
    finally:
        service.close()
    sf.write(args.output, audio, service.sample_rate, subtype="PCM_16")
    rate = f", acceptance {stats.acceptance_rate:.2f}" if stats.acceptance_rate is not None else ""
    print(f"wrote {args.output}: {len(audio) / service.sample_rate:.2f} s of audio, voice {name}, "
          f"{stats.generated_tokens} tokens{rate}")
    return 0
