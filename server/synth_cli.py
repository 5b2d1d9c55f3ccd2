"""`pcgtts synth TEXT -o out.wav`: one utterance to a file, by the server's own request path.

The command builds the same settings as `pcgtts serve` (same flags, same PCGTTS_* variables), loads the
TTS service, and sends `POST /v1/audio/speech` with `stream: false` to the server's app in process. So the
file is what the API would return: the same validation, voices (presets, OpenAI names such as `alloy`,
voices uploaded to the server's data dir), encoders and 24 kHz output. Errors print the API's message and
exit with 2 (bad input, as argparse does) or 1 (the model or the machine failed).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pcgtts.server.settings import add_arguments

# File extension -> response_format (the API's names).
FORMATS_BY_EXTENSION = {".wav": "wav", ".mp3": "mp3", ".opus": "opus", ".ogg": "opus", ".aac": "aac",
                        ".flac": "flac", ".pcm": "pcm", ".raw": "pcm", ".ulaw": "ulaw", ".alaw": "alaw"}
# The serve options that matter for one utterance (the rest: host, port, auth, limits, ... do not).
SETTINGS = ("model", "codec", "draft", "device", "acceptance", "num_speculative_tokens", "asg_table",
            "extra_asg_tables", "max_tokens", "torch_threads", "data_dir")
EXIT_BAD_INPUT, EXIT_FAILED = 2, 1


def register(subparsers: argparse._SubParsersAction) -> None:
    extensions = " ".join(FORMATS_BY_EXTENSION)
    parser = subparsers.add_parser(
        "synth", help="speak one text into an audio file, as the server would",
        description="Speaks TEXT into a file through the server's own request path (POST /v1/audio/speech, "
                    "stream=false): the same voices, formats (24 kHz) and errors as the API.")
    parser.add_argument("text", help="what to say (at most 4096 characters)")
    parser.add_argument("-o", "--output", type=Path, default=Path("out.wav"),
                        help=f"output file (default: out.wav); its extension picks the format: {extensions}")
    parser.add_argument("--format", choices=sorted(set(FORMATS_BY_EXTENSION.values())), default=None,
                        help="the format whatever the extension")
    parser.add_argument("--voice", default=None,
                        help="preset or uploaded voice name or id, or an OpenAI name such as alloy "
                             "(default: the model's first preset)")
    parser.add_argument("--seed", type=int, default=None, help="same seed, same audio")
    parser.add_argument("--temperature", type=float, default=None, help="default: the model's")
    parser.add_argument("--speed", type=float, default=1.0, help="0.25-4.0, pitch kept (default: 1.0)")
    add_arguments(parser, only=SETTINGS)
    parser.set_defaults(func=run)


def _fail(message: str, code: int) -> int:
    print(f"pcgtts synth: error: {message}", file=sys.stderr)
    return code


def output_format(path: Path, explicit: str | None) -> str | None:
    return explicit or FORMATS_BY_EXTENSION.get(path.suffix.lower())


def argument_error(args: argparse.Namespace, fmt: str | None, body: dict) -> str | None:
    """What is wrong with the command line, found before anything loads (the model takes seconds): the
    text, the output file's folder and format, and the request fields as the API itself checks them."""
    from pcgtts.server.errors import validation_error
    from pcgtts.server.schemas import SpeechRequest
    from pydantic import ValidationError

    if not args.text.strip():
        return "TEXT is empty: there is nothing to say"
    if fmt is None:
        return (f"cannot tell the format of {str(args.output)!r} from its extension; use one of "
                f"{', '.join(FORMATS_BY_EXTENSION)} or --format")
    folder = args.output.parent
    if not folder.is_dir():
        return f"cannot write {args.output}: the folder {str(folder)!r} does not exist"
    if not os.access(folder, os.W_OK):
        return f"cannot write {args.output}: the folder {str(folder)!r} is not writable"
    try:
        SpeechRequest.model_validate(body)
    except ValidationError as exc:
        return validation_error(exc.errors(), in_body=False, model=SpeechRequest).message  # the API's words
    return None


def run(args: argparse.Namespace) -> int:
    fmt = output_format(args.output, args.format)
    body = {"model": "pcgtts", "input": args.text, "response_format": fmt, "speed": args.speed,
            "stream": False, "voice": args.voice, "seed": args.seed, "temperature": args.temperature}
    body = {k: v for k, v in body.items() if v is not None}
    if (error := argument_error(args, fmt, body)) is not None:
        return _fail(error, EXIT_BAD_INPUT)
    from fastapi.testclient import TestClient
    from pcgtts.server.app import create_app
    from pcgtts.server.cli import set_torch_threads
    from pcgtts.server.settings import settings_from
    from pcgtts.server.state import tts_config
    from pcgtts.tts import TTSService

    settings = settings_from(args)
    set_torch_threads(settings)
    try:
        service = TTSService.load(tts_config(settings))
    except (ValueError, FileNotFoundError) as exc:  # a bad flag (unknown rule, missing model dir, ...)
        return _fail(str(exc), EXIT_BAD_INPUT)
    try:
        with TestClient(create_app(settings, service), raise_server_exceptions=False) as client:
            response = client.post("/v1/audio/speech", json=body)
    finally:
        service.close()
    if response.status_code != 200:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = f"HTTP {response.status_code}"
        return _fail(message, EXIT_BAD_INPUT if response.status_code < 500 else EXIT_FAILED)
    try:
        args.output.write_bytes(response.content)
    except OSError as exc:
        return _fail(f"cannot write {args.output}: {exc.strerror}", EXIT_FAILED)
    print(f"wrote {args.output}: {fmt}, {_summary(response.headers)}")
    return 0


def _summary(headers) -> str:
    """What the response headers say about the utterance."""
    parts = [f"{headers.get('x-pcgtts-audio-seconds', '?')} s of audio",
             f"{headers.get('x-pcgtts-output-tokens', '?')} tokens"]
    if (rate := headers.get("x-pcgtts-acceptance-rate")) not in (None, "None"):
        parts.append(f"acceptance {float(rate):.2f}")
    return ", ".join(parts)
