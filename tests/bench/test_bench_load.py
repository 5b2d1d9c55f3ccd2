"""pcgtts bench load's measures: the player's stall, nearest-rank quantiles, and real-time capacity; and
one sweep end to end."""

from __future__ import annotations

import json

import pytest
from pcgtts.bench.load_test import capacity, summarize
from pcgtts.bench.served import quantile, stall_seconds
from server_support import build_tiny_bundle

from pcgtts.cli import main as pcgtts_main

RATE = 24000
SECOND = 2 * RATE  # bytes of one second of 16-bit mono audio


def test_stall_is_the_time_a_player_started_at_the_first_byte_waits():
    assert stall_seconds([]) == 0.0
    # 1 s of audio at t=0.5, the next second at 1.2 s: the player still had 0.3 s left -> no stall
    assert stall_seconds([(0.5, SECOND), (1.2, SECOND)]) == 0.0
    # the next second only at 2.0 s: the player ran dry at 1.5 s and waited 0.5 s; then 1 s more at 3.2 s:
    # its buffer (until 3.0 s) ran dry again for 0.2 s
    assert abs(stall_seconds([(0.5, SECOND), (2.0, SECOND), (3.2, SECOND)]) - 0.7) < 1e-9


def test_quantile_is_nearest_rank():
    values = [float(i) for i in range(1, 21)]  # 1..20
    assert quantile(values, 0.5) == 10.0 and quantile(values, 0.95) == 19.0 and quantile(values, 0.99) == 20.0
    assert quantile([3.0], 0.95) == 3.0 and quantile([], 0.5) is None


def level(concurrency: int, ttfa: float, stall: float, failed: int = 0) -> dict:
    ok = [{"ttfa_s": ttfa, "rtf": 0.5, "stall_s": stall, "audio_s": 2.0} for _ in range(2 * concurrency)]
    return summarize(concurrency, ok, failed, wall=4.0)


def test_server_cpu_counts_its_child_processes():
    """The server's codec runs in child processes (tts/codec_process.py): their CPU time is the server's."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from pcgtts.bench.load_test import cpu_seconds

    burn = "import time\nend = time.process_time() + 1\nwhile time.process_time() < end: pass\ntime.sleep(30)"
    spawn = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}])"
    parent = subprocess.Popen([sys.executable, "-c", spawn], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while cpu_seconds(parent.pid) < 1.0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cpu_seconds(parent.pid) >= 1.0  # the parent itself only waits: the second is its child's
    finally:
        os.killpg(parent.pid, signal.SIGKILL)  # the child too
        parent.wait()


def test_capacity_is_the_largest_level_meeting_both_targets_with_all_below_it():
    rows = [level(1, 0.3, 0.0), level(4, 0.6, 0.1), level(8, 0.9, 0.2), level(12, 1.1, 0.0),
            level(16, 0.5, 0.0)]
    assert [r["real_time"] for r in rows] == [True, True, True, False, True]
    assert capacity(rows) == 8  # 16 passing after 12 failed does not count
    assert capacity([level(1, 0.3, 0.25)]) == 0
    assert not level(2, 0.3, 0.0, failed=1)["real_time"]
    assert rows[1]["audio_s_per_wall_s"] == 4.0 and rows[1]["ttfa_p95_s"] == 0.6


def test_a_sweep_against_a_started_server_reports_capacity_with_its_machine_and_cpu_cost(tmp_path):
    """`pcgtts bench load` end to end: it starts `pcgtts serve` on a tiny bundle, streams from it, and its
    report names the machine and, per level, audio seconds per server CPU-second (the capacity level's row
    again as `at_capacity`)."""
    bundle = build_tiny_bundle(tmp_path / "bundle")
    out = tmp_path / "out"
    assert pcgtts_main(["bench", "load", "--model", str(bundle), "--concurrency", "1", "2",
                        "--per-client", "1", "--full", "--out", str(out)]) == 0
    report = json.loads((out / "load.json").read_text())
    assert report["machine"]["cpu"] and report["machine"]["cores"] >= 1
    assert [r["concurrency"] for r in report["rows"]] == [1, 2]
    for row in report["rows"]:
        assert row["failed"] == 0 and row["audio_s"] > 0
        assert row["audio_s_per_server_cpu_s"] > 0  # the server process's own CPU time was read
        assert row["audio_s_per_server_cpu_s"] * row["server_cpu_s_per_audio_s"] == pytest.approx(1, rel=0.01)
    at = report["at_capacity"]
    assert (at is None) == (report["capacity"] == 0)
    if at is not None:
        assert at == next(r for r in report["rows"] if r["concurrency"] == report["capacity"])
