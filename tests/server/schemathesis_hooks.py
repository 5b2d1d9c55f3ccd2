"""Schemathesis hooks for the API fuzz test (tests/server/test_server_fuzz.py): what a schema cannot say.

A schema says "a string", not "base64 of a reference clip with its transcript": a schema-valid (positive)
speech request that carries `ref_audio` gets a real 1.5 s clip, and a transcript if it brought a blank
one, so that "schema-valid request rejected" means what it says for every field the schema can describe.
Negative cases go out as generated. Inline clips that are not audio have their own tests."""

from __future__ import annotations

import base64
import io

import schemathesis
import soundfile as sf
from server_support import tone


def _clip_base64(seconds: float = 1.5, rate: int = 22050) -> str:
    buf = io.BytesIO()
    sf.write(buf, tone(seconds, rate), rate, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


CLIP = _clip_base64()


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return
    body = case.body
    if case.operation.path == "/v1/audio/speech" and isinstance(body, dict) and body.get("ref_audio"):
        body["ref_audio"] = CLIP
        if not isinstance(body.get("ref_text"), str) or not body["ref_text"].strip():
            body["ref_text"] = "a reference clip"
