"""API keys and origins: constant-time key checks, where a WebSocket may carry its key, which browser
origins may open a WebSocket, and keys kept out of every log line.

A WebSocket authenticates at the handshake, by any of (first match wins):
* `Authorization: Bearer KEY` (clients that can set headers);
* the subprotocol `pcgtts.bearer.<base64url(KEY)>` offered beside `pcgtts` (browsers: `new WebSocket(url,
  ["pcgtts", "pcgtts.bearer." + b64url(key)])`); the server selects `pcgtts`, never echoing the key;
* `?api_key=KEY` (kept for old clients; redacted from logs, but prefer the two above: URLs end up in
  proxies' and browsers' histories).

No log line shows the configured key in any form it travels in (see `SecretRedactor`).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import re
import threading
from urllib.parse import quote, quote_plus, urlsplit

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


def key_forms(key: str) -> set[str]:
    """The forms a key travels in: as given, base64url and base64 (the playground's WebSocket subprotocol
    `pcgtts.bearer.<base64url(KEY)>`, padded or not) and percent-encoded (a URL's query)."""
    raw = key.encode()
    forms = {key, quote(key, safe=""), quote_plus(key)}
    for encoded in (base64.urlsafe_b64encode(raw).decode(), base64.b64encode(raw).decode()):
        forms |= {encoded, encoded.rstrip("=")}
    return {f for f in forms if f}


class SecretRedactor:
    """Rewrites every log record of every logger before any handler sees it (a log-record factory, so it
    also covers loggers and handlers made later: uvicorn's, its access log, the websockets library's
    handshake lines at debug level): the configured keys in each of their forms, by value, and by
    pattern any `api_key=...` / `Bearer ...` (another server's key is a secret too)."""

    def __init__(self):
        self._forms: set[str] = set()
        self._by_value: re.Pattern | None = None
        self._lock = threading.Lock()
        self._installed = False

    def add(self, key: str) -> None:
        """Redact `key` in all its forms too."""
        with self._lock:
            self._forms |= key_forms(key)
            alternatives = sorted(self._forms, key=len, reverse=True)  # the longest form first
            self._by_value = re.compile("|".join(map(re.escape, alternatives)))

    def redact(self, text: str) -> str:
        text = _SECRET_IN_TEXT.sub(lambda m: (m.group(1) or m.group(2)) + _REDACTED, text)
        by_value = self._by_value
        return by_value.sub(_REDACTED, text) if by_value is not None else text

    def install(self) -> None:
        """Scrub every record this process logs from now on (once; later calls do nothing)."""
        with self._lock:
            if self._installed:
                return
            make_record = logging.getLogRecordFactory()

            def redacting_factory(*args, **kwargs) -> logging.LogRecord:
                record = make_record(*args, **kwargs)
                self.scrub(record)
                return record

            logging.setLogRecordFactory(redacting_factory)
            self._installed = True

    def scrub(self, record: logging.LogRecord) -> None:
        if isinstance(record.args, tuple):  # argument by argument first: uvicorn's access formatter unpacks
            record.args = tuple(self.redact(a) if isinstance(a, str) else a for a in record.args)  # them
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: let logging report it as usual
            return
        redacted = self.redact(message)
        if redacted != message:  # in the format, in an argument that is not a str (bytes, headers), or split
            record.msg, record.args = redacted, ()  # across the two: the formatted line, redacted
        if record.exc_info and record.exc_info[1] is not None:
            text = logging.Formatter().formatException(record.exc_info)
            if (clean := self.redact(text)) != text:
                record.exc_text = clean  # formatters print exc_text when it is set
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)


REDACTOR = SecretRedactor()


def protect_key_in_logs(api_key: str | None) -> None:
    """From now on no log line of this process shows `api_key` in any form (nor any bearer token or
    `api_key=` value); without a key, only the patterns."""
    if api_key:
        REDACTOR.add(api_key)
    REDACTOR.install()
