"""bench/common.py: the one decode accounting, machine record and result writing every benchmark uses, and one
name per quantity across the benchmarks and their committed results."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
from pathlib import Path

import pytest
from pcgtts.bench.common import DecodeTally, machine, speedup_cell, timing_cells, write_json
from pcgtts.engine import Generation

BENCH = Path(__file__).resolve().parents[2] / "bench"
# names a quantity had before the toolkit, each now called by its one name (bench/common.py's docstring)
RETIRED = {"tokens_per_step": "tokens_per_verify_step", "accepted_over_drafted": "acceptance_rate",
           "speedup_vs_target_only": "speedup", "generated_tokens": "tokens"}


def generation(tokens: int, steps: int, drafted: int, accepted: int) -> Generation:
    return Generation(request_id="r", token_ids=list(range(tokens)), finish_reason="stop",
                      num_drafted=drafted, num_accepted=accepted, num_steps=steps)


def test_tally_sums_generations_and_forms_each_rate_once():
    tally = DecodeTally.of([generation(10, 4, 9, 6), generation(5, 3, 6, 2)])
    assert (tally.tokens, tally.steps, tally.drafted, tally.accepted) == (15, 7, 15, 8)
    assert tally.acceptance_rate == 8 / 15 and tally.tokens_per_verify_step == 15 / 7
    assert tally.mean_accepted_len == tally.tokens_per_verify_step  # the contract's name for it
    assert tally.fields() == {"tokens": 15, "steps": 7, "drafted": 15, "accepted": 8,
                              "acceptance_rate": 8 / 15, "tokens_per_verify_step": 15 / 7}
    target_only = DecodeTally.of([generation(6, 6, 0, 0)])
    assert target_only.acceptance_rate is None and target_only.tokens_per_verify_step == 1.0
    assert DecodeTally().tokens_per_verify_step is None


def test_machine_record_and_result_file(tmp_path):
    record = machine()
    assert {"cpu", "cores", "torch", "torch_threads", "native_bf16", "cuda"} <= record.keys()
    assert record["cores"] >= 1 and record["cpu"]
    engine_tree = Path(inspect.getfile(Generation)).resolve().parent  # any folder of the engine's checkout
    head = subprocess.run(["git", "-C", str(engine_tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    if head.returncode == 0:  # a checkout: the record names its commit
        assert record["source"].removesuffix("+changes") == head.stdout.strip()
    else:
        assert record["source"] is None
    path = write_json(tmp_path / "new" / "result.json", {"machine": record, "rows": [1.5]})
    assert path.read_text().endswith("\n") and json.loads(path.read_text())["machine"] == record


def test_side_by_side_cells_are_the_medians_and_the_per_repeat_ratios():
    """A side-by-side table's cells: the median of the per-repeat base / this ratios and their range, and
    each side's median time in ms."""
    base, this = [0.030, 0.020, 0.050], [0.015, 0.020, 0.025]  # ratios 2.0, 1.0, 2.0
    assert speedup_cell(base, this) == "2.00x (1.00-2.00)"
    assert timing_cells(base, this) == "30.0 | 20.0 | 2.00x (1.00-2.00)"
    assert timing_cells([0.001], [0.002], digits=2) == "1.00 | 2.00 | 0.50x (0.50-0.50)"


def bench_sources() -> dict[str, str]:
    return {p.name: p.read_text() for p in BENCH.glob("*.py") if p.name != "common.py"}


@pytest.mark.parametrize("pattern, what", [
    (r"sum\([^)]*\.num_(drafted|accepted|steps)|spec_num_drafts", "decode accounting"),
    (r"platform\.|cpu_count\(|/proc/cpuinfo", "the machine record"),
    (r"write_text\(json\.dumps", "result writing"),
])
def test_only_the_toolkit_does_it(pattern, what):
    """Every benchmark counts, records the machine and writes results through bench/common.py (the runbook
    writes a checkpoint config and a bundle manifest, not results)."""
    sources = bench_sources()
    if what == "result writing":
        sources.pop("llasa_runbook.py")
    offenders = sorted(name for name, text in sources.items() if re.search(pattern, text))
    assert offenders == [], f"{what} outside bench/common.py"


def test_one_name_per_quantity_in_benches_and_results():
    """No benchmark, results file (JSON keys), training recipe or shipped model evaluation uses a retired
    name; mean_accepted_len appears only in `bench acceptance`'s rows (its README notes the renames)."""
    root = BENCH.parent
    files = list(bench_sources().items()) + [(str(p.relative_to(BENCH)), p.read_text())
                                             for p in (BENCH / "results").rglob("*.json")]
    files += [(str(p.relative_to(root)), p.read_text())
              for p in [*(root / "recipes").rglob("*.py"), *(root / "models").glob("*/eval.json")]]
    for name, text in files:
        for old, new in RETIRED.items():
            assert not re.search(rf"\b{old}\b", text), f"{name} says {old}; the name is {new}"
        assert not re.search(r'"gamma":|"--gamma"', text), f"{name}: the setting is num_speculative_tokens"
        if "mean_accepted_len" in text:
            assert name == "acceptance_sweep.py" or name.startswith("results/acceptance/"), name
