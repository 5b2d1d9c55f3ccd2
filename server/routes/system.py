"""Liveness, readiness, model listing and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pcgtts.server.audio.formats import OUTPUT_SAMPLE_RATE, RESPONSE_FORMATS, output_rate
from pcgtts.server.limits import request_limits
from pcgtts.server.schemas import ModelCard, ModelList
from pcgtts.server.state import get_state
from prometheus_client import CONTENT_TYPE_LATEST

router = APIRouter(tags=["system"])


@router.get("/health", summary="Liveness", responses={503: {"description": "the engine failed"}})
async def health(request: Request) -> JSONResponse:
    """200 while the process serves HTTP, also during model loading and draining; 503 once the engine has
    failed every request with a fault that is no request's (device lost, out of memory): restart it."""
    fault = get_state(request).engine_fault
    if fault is not None:
        return JSONResponse({"status": "failed", "error": fault}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/ready", summary="Readiness",
            responses={503: {"description": "loading, draining for shutdown, or failed"}})
async def ready(request: Request) -> JSONResponse:
    """200 once the model is loaded and requests can be served; 503 before, while draining on SIGTERM, or
    when the model failed to load or the engine failed."""
    state = get_state(request)
    if state.drain.draining:
        return JSONResponse({"status": "draining", "error": None}, status_code=503)
    if state.engine_fault is not None:
        return JSONResponse({"status": "failed", "error": state.engine_fault}, status_code=503)
    if state.service is not None:
        return JSONResponse({"status": "ready", "model": state.service.model_id})
    body = {"status": "failed" if state.load_error else "loading", "error": state.load_error}
    return JSONResponse(body, status_code=503)


@router.get("/v1/models", response_model=ModelList, summary="List models")
async def list_models(request: Request) -> ModelList:
    """The served model; `pcgtts` describes what requests may choose (acceptance rules, ASG tables) and the
    limits of every option, the same as /openapi.json states. Sample rates: `codec_sample_rate` is what the
    model's codec makes, `output_sample_rate` what responses carry (resampled; `output_sample_rates` by
    format: G.711 is 8 kHz)."""
    state = get_state(request)
    details = None
    if state.service is not None:
        capabilities = state.service.capabilities()
        details = {**capabilities, "output_sample_rate": OUTPUT_SAMPLE_RATE,
                   "output_sample_rates": {fmt: output_rate(fmt) for fmt in RESPONSE_FORMATS},
                   "limits": request_limits(capabilities)}
    return ModelList(data=[ModelCard(id=state.model_name, created=state.started_at, pcgtts=details)])


@router.get("/v1/audio/models", summary="Speech models (Open WebUI's listing)")
async def list_audio_models(request: Request) -> dict:
    """`{"models": [{"id": ...}]}`, the shape Open WebUI reads; every name maps to the served model."""
    return {"models": [{"id": name} for name in (get_state(request).model_name, "tts-1", "tts-1-hd")]}


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def metrics(request: Request) -> Response:
    return Response(get_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)
