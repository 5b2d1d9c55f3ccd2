"""What every benchmark shares: the decode accounting (drafted / accepted / steps), the record of the machine
a result was measured on, result files, and the speech requests the decoding benchmarks run.

One name per quantity, in every benchmark, in bench/results/ and in the README:

    tokens                  generated tokens (stop tokens included)
    acceptance_rate         accepted / drafted: the share of draft tokens the target accepted (None if none)
    tokens_per_verify_step  tokens / steps: the tokens a request gets per engine step it takes part in, each
                            a draft-and-verify round when speculating (1 target-only, at most γ+1; a
                            feature-head row's first step after its prompt is target-only)
    mean_accepted_len       the DESIGN contract's name for tokens_per_verify_step in `bench acceptance` rows
    tokens_per_s            tokens / wall-clock seconds
    speedup                 tokens_per_s / target-only's tokens_per_s in the same run

and the setting `num_speculative_tokens` (γ, draft tokens per step: the engine's and the HTTP API's name, in
flags, parameters and result keys; γ or gamma only inside a formula).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from pcgtts.engine import Engine, Generation, SamplingParams
    from pcgtts.tts.bundle import ModelBundle

# Held-out style sentences (not from the training corpus's sources): plain, varied, 4-12 words.
SENTENCES = [
    "The little boat drifted slowly toward the northern shore.",
    "Please bring three apples and a loaf of bread.",
    "My brother plays the violin every Sunday evening.",
    "The museum opens at nine and closes at five.",
    "A cold wind blew across the empty parking lot.",
    "She painted the kitchen a bright shade of yellow.",
    "We should leave early to avoid the heavy traffic.",
    "The old clock in the hallway stopped at midnight.",
    "He forgot his umbrella on the crowded train.",
    "Fresh snow covered the mountain road this morning.",
    "Our teacher read a story about a clever fox.",
    "The garden needs water after such a dry week.",
    "They counted the stars until the clouds rolled in.",
    "A quiet voice answered from behind the door.",
    "The bakery on the corner sells warm pretzels.",
    "Turn left at the bridge and follow the river.",
]


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den, or None when there is nothing to divide by."""
    return num / den if num is not None and den else None


def speedup_cell(base_seconds: list[float], this_seconds: list[float]) -> str:
    """'1.23x (1.10-1.40)': the median over repeats of base / this time, and its range (a table cell of a
    side-by-side run; above 1x, this is faster)."""
    ratios = [b / t for b, t in zip(base_seconds, this_seconds, strict=True)]
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def timing_cells(base_seconds: list[float], this_seconds: list[float], digits: int = 1) -> str:
    """'27.5 | 24.4 | 1.16x (0.91-1.41)': the median ms of each side and `speedup_cell` (three cells of a
    side-by-side table)."""
    base_ms, this_ms = (1e3 * statistics.median(t) for t in (base_seconds, this_seconds))
    return f"{base_ms:.{digits}f} | {this_ms:.{digits}f} | {speedup_cell(base_seconds, this_seconds)}"


@dataclass(frozen=True)
class DecodeTally:
    """Totals of a set of generations, and the quantities made of them."""

    tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0

    @classmethod
    def of(cls, generations: Iterable[Generation]) -> DecodeTally:
        gens = list(generations)
        return cls(tokens=sum(len(g.token_ids) for g in gens), steps=sum(g.num_steps for g in gens),
                   drafted=sum(g.num_drafted for g in gens), accepted=sum(g.num_accepted for g in gens))

    @property
    def acceptance_rate(self) -> float | None:
        return ratio(self.accepted, self.drafted)

    @property
    def tokens_per_verify_step(self) -> float | None:
        return ratio(self.tokens, self.steps)

    @property
    def mean_accepted_len(self) -> float | None:
        """The DESIGN contract's name for tokens_per_verify_step in `bench acceptance` rows."""
        return self.tokens_per_verify_step

    def fields(self) -> dict:
        """The counts and the two rates, as result rows carry them."""
        return {"tokens": self.tokens, "steps": self.steps, "drafted": self.drafted,
                "accepted": self.accepted, "acceptance_rate": self.acceptance_rate,
                "tokens_per_verify_step": self.tokens_per_verify_step}


def machine() -> dict:
    """What a result was measured on: the CPU's model name, cores, torch and its threads, native bf16, the
    CUDA device. Machines here are shared and noisy: compare only ratios taken side by side in one run."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from pcgtts.engine.model.loader import cpu_has_native_bf16

    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "native_bf16": cpu_has_native_bf16(),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "source": source_build()}


def source_build() -> str | None:
    """The commit of the checkout the running engine code was imported from ("+changes" when its tracked
    files differ from it); None outside a git checkout. Two builds compared side by side run from two
    checkouts, and an editable install can serve subpackages from another tree than the one on the path:
    this records which code actually ran."""
    from pcgtts import engine

    where = str(Path(engine.__file__).resolve().parent)  # through links, to the tree the code lives in

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", where, *args], capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+changes" if changed else "")


def write_json(path: Path, data) -> Path:
    """One result file (its folder made if missing), indented, newline-terminated."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def shown_path(path: Path) -> str:
    """A path as results files show it: relative to the working directory, else its name (no machine
    paths in results)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return Path(path).name


def speech_requests(bundle: ModelBundle, n: int, temperature: float, max_tokens: int, seed: int = 0,
                    sentences: Sequence[str] = SENTENCES) -> tuple[list[list[int]], list[SamplingParams]]:
    """n speech requests of the bundle's family: sentences[i] (cycled; default SENTENCES) in its i-th preset
    voice (cycled, names sorted; none for a family without presets), seed + i, the family's stop tokens and
    constraint."""
    from pcgtts.engine import SamplingParams

    family = bundle.load_family()
    presets = family.preset_voices()
    voices = sorted(presets)
    prompts, params = [], []
    for i in range(n):
        prompt = family.build_prompt(sentences[i % len(sentences)], presets[voices[i % len(voices)]]
                                     if voices else None)
        prompts.append(prompt.token_ids)
        params.append(SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed + i,
                                     stop_token_ids=prompt.stop_token_ids, constraint=prompt.constraint))
    return prompts, params


def batched(prompts: list, params: list, batch_size: int) -> list[tuple[list, list]]:
    """The prompts (and their params) in consecutive batches of `batch_size`."""
    return [(prompts[i:i + batch_size], params[i:i + batch_size]) for i in range(0, len(prompts), batch_size)]


def timed_decode(engine: Engine, prompts: list, params: list, batch_size: int
                 ) -> tuple[list[list[int]], float]:
    """Each prompt's tokens, decoded in consecutive batches of `batch_size`, and the wall seconds it took."""
    start = time.perf_counter()
    tokens = [g.token_ids for p, s in batched(prompts, params, batch_size) for g in engine.generate(p, s)]
    return tokens, time.perf_counter() - start


def alternating_decodes(engine: Engine, prompts: list, params: list, batch_size: int,
                        forms: dict[str, Callable[[], None]], repeats: int) -> dict:
    """Tokens/s of two forms of one engine side by side: `forms` maps each form's name to a callable that puts
    the engine in it; the prompts are decoded in consecutive batches of `batch_size` once per form and
    repeat, the order flipped every repeat (a shared machine drifts by more than the change between runs
    minutes apart), after one untimed decode (a batch size's first decode pays one-time costs). Returns
    {"tokens_per_s": {form: [per repeat]}, "ratios": [second / first per repeat], "ratio_median"}; the
    engine is left in the first form."""
    first, second = forms
    timed_decode(engine, prompts[:batch_size], params[:batch_size], batch_size)
    rates: dict[str, list[float]] = {first: [], second: []}
    for repeat in range(repeats):
        for form in (first, second) if repeat % 2 == 0 else (second, first):
            forms[form]()
            tokens, seconds = timed_decode(engine, prompts, params, batch_size)
            rates[form].append(sum(map(len, tokens)) / seconds)
    forms[first]()
    ratios = [b / a for a, b in zip(rates[first], rates[second], strict=True)]
    return {"tokens_per_s": rates, "ratios": ratios, "ratio_median": statistics.median(ratios)}


def alternating_forwards(engine: Engine, prompts: list, params: list, forms: dict[str, Callable[[], None]],
                         at: Iterable[int], repeats: int) -> list[dict]:
    """One batched forward of the target timed in each form side by side, over the same K/V: the prompts are
    decoded together, and at the `at`-th forwards of the whole batch's rows (decode forwards target-only,
    verify forwards of γ+1 tokens a row when speculating) that same forward runs `repeats` times in each
    form, the order flipped every round, then the decode goes on (rewriting the same K/V slots with the same
    values leaves it unchanged). Per forward: rows, tokens per row, context, and per form its median ms,
    the first form's median over it, and its hidden states' largest difference from the first form's
    (0.0: the same bits). The engine is left in the first form."""
    from pcgtts.engine.model import llama

    model, rows, at = engine.target.model, len(prompts), set(at)
    forward, seen, measured = llama.LlamaModel.hidden_states, [0], []

    def compare(ids, meta, cache, backend) -> dict:
        outputs, times = {}, {form: [] for form in forms}
        for form, put in forms.items():
            put()
            outputs[form] = forward(model, ids, meta, cache, backend)
        for i in range(repeats):
            for form in (forms if i % 2 == 0 else reversed(forms)):
                forms[form]()
                start = time.perf_counter()
                forward(model, ids, meta, cache, backend)
                times[form].append(time.perf_counter() - start)
        first = next(iter(forms))
        forms[first]()
        medians = {form: statistics.median(t) for form, t in times.items()}
        context = int(meta.positions.max()) + 1
        return {"rows": ids.shape[0], "tokens_per_row": ids.shape[1], "context": context,
                "forms": {form: {"ms": 1e3 * m, "first_over_this": medians[first] / m,
                                 "max_abs_diff": float((outputs[form] - outputs[first]).abs().max())}
                          for form, m in medians.items()}}

    def timed(self, ids, meta, cache, backend):
        if self is model and ids.shape[0] == rows and meta.row_positions is not None:
            seen[0] += 1
            if seen[0] in at:
                measured.append(compare(ids, meta, cache, backend))
        return forward(self, ids, meta, cache, backend)

    llama.LlamaModel.hidden_states = timed
    try:
        engine.generate(prompts, params)
    finally:
        llama.LlamaModel.hidden_states = forward
    return measured


def bundle_engine(bundle: ModelBundle, rule: str, *, num_speculative_tokens: int = 3,
                  decode_graphs: str = "eager", device: str = "cpu", dtype: str = "auto",
                  compile_cache_dir: Path | None = None, deterministic: str | None = None,
                  draft_confidence: float = 0.0, max_num_seqs: int | None = None,
                  cpu_attention: str | None = None, cpu_weights: str | None = None,
                  cpu_kv: str | None = None, draft_branches: int = 1, speculation: str = "always",
                  speculation_lengths: tuple[int, ...] = (), draft_dir: Path | None = None) -> Engine:
    """An engine over the bundle's target: "target-only", or speculation with the bundle's draft verified by
    `rule` (a rule over groups, pcg or pcg-block, over the bundle's ASG table). deterministic:
    EngineConfig.deterministic (None: its default); draft_confidence: EngineConfig's θ (num_speculative_tokens
    is then the most a row drafts); max_num_seqs: the batch it may run; cpu_attention: rows | sdpa;
    cpu_weights: fp16 | fp32 | bf16 | int8, cpu_kv: fp16 | fp32 (None for these: EngineConfig's);
    draft_branches: k of a token tree; speculation, speculation_lengths: EngineConfig's (the policy; "always"
    by default, as a benchmark of one draft length wants); draft_dir: another draft than the bundle's."""
    from pcgtts.engine import Engine, EngineConfig
    from pcgtts.engine.acceptance import uses_asg_table

    spec = rule != "target-only"
    return Engine(EngineConfig(
        target=bundle.target_dir, draft=(draft_dir or bundle.draft_dir) if spec else None,
        acceptance=rule if spec else "exact",
        asg_table=bundle.asg_table if spec and uses_asg_table(rule) else None,
        num_speculative_tokens=num_speculative_tokens if spec else 0, device=device, dtype=dtype,
        decode_graphs=decode_graphs, compile_cache_dir=compile_cache_dir, draft_confidence=draft_confidence,
        draft_branches=draft_branches if spec else 1, speculation=speculation,
        speculation_lengths=speculation_lengths if spec else (),
        **({} if deterministic is None else {"deterministic": deterministic}),
        **({} if max_num_seqs is None else {"max_num_seqs": max_num_seqs}),
        **({} if cpu_attention is None else {"cpu_attention": cpu_attention}),
        **({} if cpu_weights is None else {"cpu_weights": cpu_weights}),
        **({} if cpu_kv is None else {"cpu_kv": cpu_kv})))
