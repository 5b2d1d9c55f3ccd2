"""The served model's request limits, published where clients look: `GET /v1/models` (`pcgtts.limits`) and
`/openapi.json` (the speech request's schema), so that schema-driven clients and fuzzers send what the
server accepts, and the server accepts what they send.

`schemas.py` bounds each option for any model. Once a model is loaded it narrows some (`TTSService.limits`:
top_k to its vocabulary, num_speculative_tokens to its γ, max_tokens from the fewest tokens that make
audio) and names its choices (acceptance rules, ASG tables); before that the schema shows the general
bounds.
"""

from __future__ import annotations

import copy
from typing import Any

from pcgtts.server.schemas import MIN_TEMPERATURE, TEMPERATURE_RULE, SpeechRequest

NUMERIC = ("temperature", "top_p", "top_k", "repetition_penalty", "seed", "max_tokens",
           "num_speculative_tokens", "speed")


def schema_bounds(name: str) -> dict[str, Any]:
    """{"minimum", "maximum"} of a numeric field of the speech request, as its schema declares them."""
    bounds: dict[str, Any] = {}
    for item in SpeechRequest.model_fields[name].metadata:
        if getattr(item, "ge", None) is not None:
            bounds["minimum"] = item.ge
        if getattr(item, "le", None) is not None:
            bounds["maximum"] = item.le
    return bounds


def request_limits(capabilities: dict | None) -> dict[str, dict[str, Any] | None]:
    """{option: {"minimum", "maximum"} or {"enum"}}, narrowed to the loaded model when there is one
    (capabilities: `TTSService.capabilities()`, None while loading). None: the option takes no value
    here (num_speculative_tokens without a draft)."""
    limits: dict[str, dict[str, Any] | None] = {name: schema_bounds(name) for name in NUMERIC}
    limits["temperature"] = {**limits["temperature"], "rule": TEMPERATURE_RULE}
    if capabilities is None:
        return limits
    for name, bounds in capabilities["limits"].items():
        limits[name] = {**(limits.get(name) or {}), **bounds}
    if not capabilities["num_speculative_tokens"]:
        limits["num_speculative_tokens"] = None
    limits["acceptance"] = {"enum": list(dict.fromkeys([*capabilities["acceptance_rules"],
                                                         capabilities["acceptance"]]))}
    limits["asg_table"] = {"enum": capabilities["asg_tables"]} if capabilities["asg_tables"] else None
    return limits


def _value_branch(spec: dict) -> dict:
    """The non-null alternative of an optional field's schema (the field itself when it is not optional)."""
    return next((b for b in spec.get("anyOf", []) if b.get("type") != "null"), spec)


def publish_limits(openapi: dict, limits: dict[str, dict[str, Any] | None]) -> dict:
    """A copy of the OpenAPI document whose SpeechRequest says `limits`; temperature as its two pieces,
    0 (greedy) or MIN_TEMPERATURE..max."""
    out = copy.deepcopy(openapi)
    props = out["components"]["schemas"]["SpeechRequest"]["properties"]
    for name, bounds in limits.items():
        spec = props[name]
        if bounds is None:  # only null is accepted
            spec.pop("anyOf", None)
            spec["type"] = "null"
            continue
        branch = _value_branch(spec)
        branch.update({k: v for k, v in bounds.items() if k in ("minimum", "maximum", "enum")})
    temperature = props["temperature"]
    number = _value_branch(temperature)
    top = number.get("maximum")
    temperature["anyOf"] = [{"type": "number", "minimum": 0, "maximum": 0},
                            {"type": "number", "minimum": MIN_TEMPERATURE, "maximum": top},
                            {"type": "null"}]
    return out
