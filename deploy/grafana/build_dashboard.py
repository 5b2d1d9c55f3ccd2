"""Writes dashboards/pcgtts.json, the provisioned Grafana dashboard (run after changing a panel).

Kept as code so every PromQL expression sits in one readable list; tests check that each metric the
dashboard names is exported by the server.
"""

from __future__ import annotations

import json
from pathlib import Path

P = "pcgtts:"  # metric prefix; names follow vLLM's where the meaning is the same
RATE = "[$__rate_interval]"
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}


def quantiles(metric: str) -> list[tuple[str, str]]:
    return [(f"p{int(q * 100)}", f"histogram_quantile({q}, sum by(le)(rate({P}{metric}_bucket{RATE})))")
            for q in (0.5, 0.9, 0.99)]


# (title, unit, [(legend, expr)])
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("Acceptance rate (accepted / drafted)", "percentunit", [
        ("acceptance", f"sum(rate({P}spec_decode_num_accepted_tokens_total{RATE})) / "
                       f"sum(rate({P}spec_decode_num_draft_tokens_total{RATE}))"),
    ]),
    ("Tokens per verify step", "short", [
        ("tokens per verify step", f"1 + sum(rate({P}spec_decode_num_accepted_tokens_total{RATE})) / "
                                    f"sum(rate({P}spec_decode_num_drafts_total{RATE}))"),
    ]),
    ("Acceptance by draft position", "percentunit", [
        ("pos {{position}}",
         f"sum by(position)(rate({P}spec_decode_num_accepted_tokens_per_pos_total{RATE})) "
         f"/ scalar(sum(rate({P}spec_decode_num_drafts_total{RATE})))"),
    ]),
    ("Tokens per second", "short", [
        ("generated", f"sum(rate({P}generation_tokens_total{RATE}))"),
        ("prompt", f"sum(rate({P}prompt_tokens_total{RATE}))"),
    ]),
    ("Audio produced (seconds of audio per second)", "short", [
        ("audio s/s", f"sum(rate({P}audio_seconds_total{RATE}))"),
    ]),
    ("Time to first audio", "s", quantiles("audio_time_to_first_chunk_seconds")),
    ("Real-time factor (wall / audio, lower is better)", "short", quantiles("audio_rtf")),
    ("End-to-end request latency", "s", quantiles("e2e_request_latency_seconds")),
    ("Requests running / waiting", "short", [
        ("running", f"sum({P}num_requests_running)"),
        ("waiting", f"sum({P}num_requests_waiting)"),
    ]),
    ("KV cache usage", "percentunit", [
        ("kv used", f"max({P}kv_cache_usage_perc)"),
    ]),
    ("Preemptions per second", "short", [
        ("preemptions", f"sum(rate({P}num_preemptions_total{RATE}))"),
    ]),
    ("Codec: streams per decode call, busy share, process restarts", "short", [
        ("streams/call", f"sum(rate({P}codec_decode_stream_jobs_total{RATE})) / "
                         f"sum(rate({P}codec_decode_calls_total{RATE}))"),
        ("busy", f"sum(rate({P}codec_decode_seconds_total{RATE}))"),
        ("restarts", f"sum(increase({P}codec_process_restarts_total{RATE}))"),
    ]),
    ("Capacity headroom: audio a listener holds when the next chunk arrives", "s", [
        ("p5", f"histogram_quantile(0.05, sum by(le)(rate({P}audio_buffer_headroom_seconds_bucket{RATE})))"),
        ("p50", f"histogram_quantile(0.5, sum by(le)(rate({P}audio_buffer_headroom_seconds_bucket{RATE})))"),
        ("streams", f"sum({P}audio_streams_active)"),
    ]),
    ("Streams that stalled over 0.2 s (real-time capacity exceeded when this rises)", "percentunit", [
        ("stalled", f"1 - sum(rate({P}audio_underrun_seconds_bucket{{le=\"0.2\"}}{RATE})) / "
                    f"sum(rate({P}audio_underrun_seconds_count{RATE}))"),
    ]),
    ("Prefix-cache hit rate (prompt tokens reused)", "percentunit", [
        ("hit rate", f"sum(rate({P}prefix_cache_hits_total{RATE})) / "
                     f"sum(rate({P}prefix_cache_queries_total{RATE}))"),
    ]),
    ("Decode steps by mode (load-aware speculation)", "short", [
        ("{{mode}}", f"sum by(mode)(rate({P}decode_steps_total{RATE}))"),
        ("draft length {{draft_length}}",
         f"sum by(draft_length)(rate({P}decode_steps_by_draft_length_total{RATE}))"),
    ]),
    ("Finished requests by reason", "short", [
        ("{{finished_reason}}", f"sum by(finished_reason)(rate({P}request_success_total{RATE}))"),
    ]),
]


def panel(index: int, title: str, unit: str, targets: list[tuple[str, str]]) -> dict:
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": title,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": 12, "x": (index % 2) * 12, "y": (index // 2) * 8},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
            for i, (legend, expr) in enumerate(targets)
        ],
    }


def dashboard() -> dict:
    return {
        "uid": "pcgtts-overview",
        "title": "pcgtts: speculative TTS serving",
        "tags": ["pcgtts", "tts", "speculative-decoding"],
        "timezone": "browser",
        "schemaVersion": 39,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "panels": [panel(i, *spec) for i, spec in enumerate(PANELS)],
    }


def main() -> None:
    out = Path(__file__).with_name("dashboards") / "pcgtts.json"
    out.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
