"""The playground page at `/` (plain HTML + JS under server/static, no build step)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
router = APIRouter(tags=["playground"])


@router.get("/", include_in_schema=False)
async def playground() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html")


@router.get("/favicon.ico", include_in_schema=False)
async def favicon() -> FileResponse:
    """Browsers ask for it on every page; the playground's icon (a 32 px PNG in an ICO)."""
    return FileResponse(STATIC_DIR / "favicon.ico", media_type="image/x-icon")
