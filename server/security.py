"""API keys and origins: constant-time key checks, where a WebSocket may carry its key, which browser
origins may open a WebSocket, and keys kept out of every log line.

A WebSocket authenticates at the handshake, by any of (first match wins):
* `Authorization: Bearer KEY` (clients that can set headers);
* the subprotocol `pcgtts.bearer.<base64url(KEY)>` offered beside `pcgtts` (browsers: `new WebSocket(url,
  ["pcgtts", "pcgtts.bearer." + b64url(key)])`); the server selects `pcgtts`, never echoing the key;
* `?api_key=KEY` (kept for old clients; redacted from logs, but prefer the two above: URLs end up in
  proxies' and browsers' histories).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import re
from urllib.parse import urlsplit

from starlette.datastructures import Headers, QueryParams

SUBPROTOCOL = "pcgtts"
BEARER_PREFIX = "pcgtts.bearer."
_REDACTED = "[REDACTED]"
# key=value pairs in URLs and Authorization headers, whatever logs them
_SECRET_IN_TEXT = re.compile(
    r"((?:api_key|api-key|apikey|access_token|token|key)=)[^&\s\"']+|(Bearer )[^\s\"']+", re.IGNORECASE)


def keys_equal(given: str | None, expected: str) -> bool:
    """Constant time in the key's content (hmac.compare_digest), so timing does not reveal a prefix."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def bearer_of(headers: Headers) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def http_authorized(headers: Headers, api_key: str | None) -> bool:
    return not api_key or keys_equal(bearer_of(headers), api_key)


def offered_subprotocols(headers: Headers) -> list[str]:
    return [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip()]


def _subprotocol_key(protocols: list[str]) -> str | None:
    for protocol in protocols:
        if protocol.startswith(BEARER_PREFIX):
            encoded = protocol[len(BEARER_PREFIX):]
            try:
                return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
            except (binascii.Error, UnicodeDecodeError, ValueError):
                return None
    return None


def websocket_authorized(headers: Headers, query: QueryParams, api_key: str | None) -> bool:
    if not api_key:
        return True
    candidates = (bearer_of(headers), _subprotocol_key(offered_subprotocols(headers)), query.get("api_key"))
    # every candidate is compared, so the time taken does not tell which form was used
    return sum(keys_equal(c, api_key) for c in candidates) > 0


def chosen_subprotocol(headers: Headers) -> str | None:
    """The subprotocol to accept with: `pcgtts` when offered (a browser that offered subprotocols fails a
    handshake that selects none); never the bearer one, which would echo the key."""
    return SUBPROTOCOL if SUBPROTOCOL in offered_subprotocols(headers) else None


def origin_allowed(headers: Headers, allowed: list[str]) -> bool:
    """WebSocket handshakes are not covered by CORS: a page on any site could open one with the user's
    network position. Allowed: no Origin (not a browser), the server's own origin (same host:port as
    the Host header, so the playground works), or one listed in --cors-origins (`*` allows all)."""
    origin = headers.get("origin")
    if origin is None or "*" in allowed or origin in allowed:
        return True
    parts = urlsplit(origin)
    return bool(parts.netloc) and parts.netloc.lower() == headers.get("host", "").lower()


class RedactSecrets(logging.Filter):
    """Rewrites API keys (query strings, bearer tokens) in a record's message and arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):  # argument by argument first: uvicorn's access formatter
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)  # unpacks them
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: let logging report it as usual
            return True
        redacted = redact(message)
        if redacted != message:  # a key split across format and arguments ("Bearer %s")
            record.msg, record.args = redacted, ()
        return True


def redact(text: str) -> str:
    return _SECRET_IN_TEXT.sub(lambda m: (m.group(1) or m.group(2)) + _REDACTED, text)


_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "pcgtts", "pcgtts.server")


def install_log_redaction() -> None:
    """On uvicorn's loggers (access lines carry the query string) and ours, and on the root handlers."""
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactSecrets) for f in logger.filters):
            logger.addFilter(RedactSecrets())
        for handler in logger.handlers + logging.getLogger().handlers:
            if not any(isinstance(f, RedactSecrets) for f in handler.filters):
                handler.addFilter(RedactSecrets())
