"""Embedding ASGs vs acoustic ASGs: the paper's swap test and real PCG decoding, side by side.

Held-out sentences (the model card's eval sentences, preset voices in turn) x seeds, T=0.8:

1. target-only decoding: WER (Whisper tiny.en) and speaker similarity (resemblyzer, to the preset voice's
   clip) of its audio, the baseline;
2. the swap test (PCG paper, Table 2), on the outputs of `--swap-seeds`: every code of the target-only
   output replaced by a random member of its seed group G(t); ΔWER and Δ similarity against the same
   unswapped outputs, and the share of codes changed;
3. PCG decoding with each of `--decode-tables` (one engine, the table chosen per request), on every seed:
   accepted/drafted, tokens per verify step, tokens/s, WER and similarity, Δ against target-only with
   paired-bootstrap 95% intervals over the utterances (`paired_bootstrap`).

Rows are saved as they are measured; a rerun with the same settings keeps them and measures the rest.

Tables: target input-embedding groups (`emb:θ`, cosine) and codec-centroid groups (`mel:f`, L2 radius f x
the mean distance between centroids), built in a temporary directory from the bundle.

    pcgtts bench groups [--sentences 20] [--seeds 0 1 2] [--swap-seeds 0] [--tables emb:0.55 mel:0.4 ...]
        [--decode-tables emb:0.55 mel:0.4] [--num-speculative-tokens 3 5] [--out bench/results]

Each decode table is decoded at every γ of `--num-speculative-tokens` (rows "pcg TABLE", and "pcg TABLE
γ=G" for a γ other than 3). `--cpu-kv A B` / `--cpu-weights A B`: the engine settings to decode with, the
first of each the baseline's; every other one adds its own target-only and PCG rows ("... kv:B",
"... weights:B"), scored against the baseline. `--deterministic off` runs every engine without
batch-invariance plans (bf16 products apply only outside a plan, and these requests are seeded).

Writes OUT/groups.json. Needs the `eval` extra and recipes/demo/requirements-eval.txt.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from pcgtts.asg_tables import build_asg
from pcgtts.asg_tables.embeddings import read_embedding_rows
from pcgtts.bench.common import DecodeTally, machine, shown_path, write_json
from pcgtts.engine import Engine, EngineConfig, SamplingParams
from pcgtts.engine.config import CPU_KV, CPU_WEIGHTS, DETERMINISTIC_MODES
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle

NUM_SPECULATIVE_TOKENS = 3
DEFAULT_TABLES = ("emb:0.55", "emb:0.4", "mel:0.4", "mel:0.5")
DEFAULT_DECODE_TABLES = ("mel:0.0", "emb:0.55", "mel:0.3", "mel:0.35", "mel:0.4")


def build_table(spec: str, bundle: ModelBundle, vocab, centroids: torch.Tensor, path: Path):
    """`emb:θ` (cosine over the target's input-embedding rows) or `mel:f` (L2 <= f x mean centroid
    distance over the codec's centroids)."""
    kind, value = spec.split(":")
    value = float(value)
    if kind == "emb":
        rows, meta = read_embedding_rows(bundle.target_dir, vocab.code_offset, vocab.codebook_size)
        table = build_asg(rows, value, offset=vocab.code_offset, vocab_size=vocab.vocab_size, progress=False,
                          meta=meta)
    elif kind == "mel":
        dist = torch.cdist(centroids, centroids)
        mean = float(dist[~torch.eye(len(dist), dtype=torch.bool)].mean())
        table = build_asg(centroids, value * mean, offset=vocab.code_offset, vocab_size=vocab.vocab_size,
                          progress=False, metric="l2", meta={"radius_fraction": value})
    else:
        raise ValueError(f"table spec {spec!r}: want emb:THETA or mel:FRACTION")
    table.save(path)
    return table


def swap_codes(tokens: list[int], table, rng: np.random.Generator) -> tuple[list[int], int]:
    """Each token replaced by a uniform member of its seed group (singletons stay); returns (tokens,
    number changed)."""
    out, changed = [], 0
    for t in tokens:
        members = table.members(int(table.seed_group[t]))
        new = int(members[rng.integers(len(members))])
        out.append(new)
        changed += new != t
    return out, changed


class Scorer:
    def __init__(self, family, codec, texts_of: list[str], voice_of: list[str], voices_dir: Path):
        from pcgtts.recipes.demo.eval_tools import SpeakerEncoder, Transcriber

        self.family, self.codec = family, codec
        self.transcriber, self.speaker = Transcriber(threads=1), SpeakerEncoder()
        self.texts, self.voice_of = texts_of, voice_of
        import soundfile

        self.voice_emb = {}
        for name in set(voice_of):
            wav, sr = soundfile.read(voices_dir / f"{name}.wav", dtype="float32")
            self.voice_emb[name] = self.speaker(wav)

    def __call__(self, outputs: list[list[int]], rows: list[int] | None = None) -> dict:
        """Scores outputs of the items `rows` (default all, in order); per-item results are kept so that
        a subset can be compared with the same subset of another run."""
        from pcgtts.recipes.demo.eval_tools import word_errors

        rows = list(range(len(outputs))) if rows is None else rows
        errors, words, sims, hyps = [], [], [], []
        for tokens, i in zip(outputs, rows, strict=True):
            audio = self.codec.decode(self.family.tokens_to_codes(tokens))
            hyp = self.transcriber(audio) if len(audio) >= 1600 else ""
            e, n = word_errors(self.texts[i], hyp)
            errors.append(e)
            words.append(n)
            sims.append(float(self.speaker(audio) @ self.voice_emb[self.voice_of[i]]) if hyp else 0.0)
            hyps.append(hyp)
        return {"wer": sum(errors) / max(1, sum(words)), "speaker_similarity": float(np.mean(sims)),
                "rows": rows, "errors": errors, "words": words, "similarities": sims, "examples": hyps[:2]}


def subset(scored: dict, rows: list[int]) -> dict:
    """WER and similarity of a scored run restricted to `rows`."""
    at = {r: k for k, r in enumerate(scored["rows"])}
    errors = sum(scored["errors"][at[r]] for r in rows)
    words = sum(scored["words"][at[r]] for r in rows)
    return {"wer": errors / max(1, words),
            "speaker_similarity": float(np.mean([scored["similarities"][at[r]] for r in rows]))}


def paired_bootstrap(base: dict, row: dict, resamples: int = 10_000, seed: int = 0) -> dict:
    """95% intervals of ΔWER and Δ similarity (row against base on the same utterances), resampling the
    utterances of `row` with replacement and keeping each paired with base's score of the same one."""
    at = {r: k for k, r in enumerate(base["rows"])}
    ref = [at[r] for r in row["rows"]]
    errors, words = np.array(row["errors"], float), np.array([base["words"][k] for k in ref], float)
    base_errors = np.array([base["errors"][k] for k in ref], float)
    sims = np.array(row["similarities"]) - np.array([base["similarities"][k] for k in ref])
    pick = np.random.default_rng(seed).integers(0, len(ref), (resamples, len(ref)))  # [R, n]
    d_wer = (errors[pick].sum(1) - base_errors[pick].sum(1)) / np.maximum(1.0, words[pick].sum(1))
    d_sim = sims[pick].mean(1)
    return {"delta_wer_ci95": np.quantile(d_wer, [0.025, 0.975]).tolist(),
            "delta_similarity_ci95": np.quantile(d_sim, [0.025, 0.975]).tolist()}


def add_intervals(report: dict) -> dict:
    """Every decoding row and swap test of a groups report gets its paired-bootstrap intervals."""
    base = report["decoding"]["target-only"]
    rows = [r for label, r in report["decoding"].items() if label != "target-only"]
    rows += [t["swap_test"] for t in report["tables"].values()]
    for row in rows:
        row |= paired_bootstrap(base, row)
    return report


def run(model_dir: Path, out_dir: Path, sentences: int, seeds: list[int], tables: list[str],
        temperature: float, max_tokens: int, decode_tables: list[str], swap_seeds: list[int],
        gammas: tuple[int, ...] = (NUM_SPECULATIVE_TOKENS,), kv_stores: tuple[str, ...] = (),
        weights: tuple[str, ...] = (), deterministic: str = EngineConfig.deterministic) -> dict:
    """kv_stores, weights: EngineConfig.cpu_kv and cpu_weights settings to decode with, the first of each
    the baseline's (target-only); each other adds a target-only row and PCG rows labelled "kv:SETTING" or
    "weights:SETTING", scored against that baseline. Default: EngineConfig's alone. deterministic: every
    engine's EngineConfig.deterministic ("off": no step takes a batch-invariance plan, so settings that
    apply only outside one, such as bf16 products, decode these seeded requests too)."""
    from pcgtts.recipes.demo.eval_codec import eval_sentences

    kv_stores = kv_stores or (EngineConfig.cpu_kv,)
    weights = weights or (EngineConfig.cpu_weights,)
    # (label suffix, engine settings): the baseline, then one setting changed at a time
    variants = [("", {"cpu_kv": kv_stores[0], "cpu_weights": weights[0], "deterministic": deterministic})]
    variants += [(f" kv:{kv}", variants[0][1] | {"cpu_kv": kv}) for kv in kv_stores[1:]]
    variants += [(f" weights:{w}", variants[0][1] | {"cpu_weights": w}) for w in weights[1:]]

    torch.set_num_threads(1)
    bundle = ModelBundle.from_dir(model_dir)
    family, codec = bundle.load_family(), bundle.load_codec()
    vocab, centroids = family.vocab, codec.codebook
    names = sorted(family.voices)
    texts = [t for t, _ in eval_sentences(sentences)]
    items = [(seed, k, text, names[k % len(names)]) for seed in seeds for k, text in enumerate(texts)]
    prompts = [family.build_prompt(text, family.voices[name]) for _, _, text, name in items]

    def params(**kw) -> list[SamplingParams]:
        return [SamplingParams(temperature=temperature, max_tokens=max_tokens,
                               stop_token_ids=p.stop_token_ids, seed=seed * 100003 + k,
                               constraint=p.constraint, **kw)
                for (seed, k, _, _), p in zip(items, prompts, strict=True)]

    scorer = Scorer(family, codec, [t for _, _, t, _ in items], [n for *_, n in items],
                    bundle.root / "voices")
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "groups.json"
    report: dict = {"model": shown_path(model_dir), "num_speculative_tokens": list(gammas),
                    "temperature": temperature,
                    "sentences": sentences, "seeds": seeds, "swap_seeds": swap_seeds,
                    "baseline": variants[0][1], "machine": machine(), "tables": {}, "decoding": {}}
    if out.exists():  # resume: rows already measured with the same settings are kept
        old = json.loads(out.read_text())
        if all(old.get(k) == report[k]
               for k in ("model", "temperature", "sentences", "seeds", "swap_seeds", "baseline")):
            report["tables"], report["decoding"] = old["tables"], old["decoding"]

    def save() -> None:
        write_json(out, report)

    def timed(engine: Engine, kw: dict) -> tuple[list, dict]:
        start = time.perf_counter()
        gens = engine.generate([p.token_ids for p in prompts], params(**kw))
        wall = time.perf_counter() - start
        tally = DecodeTally.of(gens)
        return gens, {"wall_s": wall, "tokens": tally.tokens, "tokens_per_s": tally.tokens / wall,
                      "acceptance_rate": tally.acceptance_rate,
                      "tokens_per_verify_step": tally.tokens_per_verify_step}

    def deltas(row: dict) -> dict:
        ref = subset(report["decoding"]["target-only"], row["rows"])
        return {"delta_wer": row["wer"] - ref["wer"],
                "delta_similarity": row["speaker_similarity"] - ref["speaker_similarity"]}

    for suffix, settings in variants:  # the baseline first, then target-only under each other setting
        gens, stats = timed(Engine(EngineConfig(target=bundle.target_dir, num_speculative_tokens=0,
                                                **settings)), {})
        if not suffix:
            baseline = [g.token_ids for g in gens]
        label = "target-only" + suffix
        if label not in report["decoding"]:
            row = stats | scorer([g.token_ids for g in gens])
            report["decoding"][label] = row if not suffix else row | deltas(row)
            save()
    base = report["decoding"]["target-only"]
    print(f"[groups] target-only WER {base['wer']:.3f} sim {base['speaker_similarity']:.3f}", flush=True)
    swap_rows = [k for k, (seed, *_) in enumerate(items) if seed in swap_seeds]

    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for spec in dict.fromkeys([*tables, *decode_tables]):
            paths[spec] = Path(tmp) / f"{spec.replace(':', '-')}.safetensors"
            table = build_table(spec, bundle, vocab, centroids, paths[spec])
            if spec not in tables or spec in report["tables"]:
                continue
            sizes = table.group_sizes()[table.seed_group[vocab.code_offset:vocab.vocab_size].long()].double()
            rng = np.random.default_rng(0)
            swapped, changed, total = [], 0, 0
            for k in swap_rows:
                new, n = swap_codes(baseline[k], table, rng)
                swapped.append(new)
                changed += n
                total += sum(vocab.code_offset <= t < vocab.vocab_size for t in baseline[k])
            row = {"mean_seed_group": float(sizes.mean()), "swapped_share": changed / total}
            row |= scorer(swapped, swap_rows)
            report["tables"][spec] = {"swap_test": row | deltas(row)}
            save()
            print(f"[groups] swap {spec}: |G| {row['mean_seed_group']:.1f} "
                  f"swapped {row['swapped_share']:.2f} {deltas(row)}", flush=True)
        for gamma, (variant, settings) in itertools.product(gammas if decode_tables else (), variants):
            engine = Engine(EngineConfig(target=bundle.target_dir, draft=bundle.draft_dir, acceptance="exact",
                                         num_speculative_tokens=gamma, asg_table=paths[decode_tables[0]],
                                         extra_asg_tables={s: paths[s] for s in decode_tables}, **settings))
            suffix = ("" if gamma == NUM_SPECULATIVE_TOKENS else f" γ={gamma}") + variant
            runs = [(f"pcg {s}{suffix}", {"acceptance": "pcg", "asg_table": s}) for s in decode_tables]
            for label, kw in runs:
                if label in report["decoding"]:
                    continue
                gens, stats = timed(engine, kw)
                row = stats | scorer([g.token_ids for g in gens])
                report["decoding"][label] = row | deltas(row)
                save()
                print(f"[groups] {label}: tok/verify {stats['tokens_per_verify_step']:.2f} {deltas(row)}",
                      flush=True)
    report["note"] = ("tokens_per_s of each row comes from its own run on a shared machine; compare speed by "
                      "tokens_per_verify_step (same draft, same verify cost)")
    add_intervals(report)
    save()
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR, help="model bundle directory")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="output directory")
    parser.add_argument("--sentences", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--tables", nargs="*", default=list(DEFAULT_TABLES),
                        help="swap-test tables: emb:THETA (target embeddings, cosine) or mel:FRACTION (codec "
                             "centroids, L2 <= FRACTION x mean distance)")
    parser.add_argument("--decode-tables", nargs="*", default=list(DEFAULT_DECODE_TABLES),
                        help="tables to decode with (PCG), on every seed")
    parser.add_argument("--swap-seeds", type=int, nargs="+", default=[0],
                        help="seeds whose target-only outputs the swap test uses")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--max-tokens", type=int, default=700)
    parser.add_argument("--num-speculative-tokens", type=int, nargs="+", default=[NUM_SPECULATIVE_TOKENS],
                        help="draft lengths γ to decode each table at")
    parser.add_argument("--cpu-kv", nargs="+", default=[EngineConfig.cpu_kv], choices=CPU_KV,
                        help="K/V stores to decode with (EngineConfig.cpu_kv), the first the target-only "
                             "baseline's; each other adds rows labelled kv:SETTING")
    parser.add_argument("--cpu-weights", nargs="+", default=[EngineConfig.cpu_weights], choices=CPU_WEIGHTS,
                        help="products' weights to decode with (EngineConfig.cpu_weights), the first the "
                             "baseline's; each other adds rows labelled weights:SETTING")
    parser.add_argument("--deterministic", default=EngineConfig.deterministic, choices=DETERMINISTIC_MODES,
                        help="every engine's batch invariance (off: bf16 products reach seeded requests too)")


def main(args: argparse.Namespace) -> int:
    report = run(args.model, args.out, args.sentences, args.seeds, args.tables, args.temperature,
                 args.max_tokens, args.decode_tables, args.swap_seeds, tuple(args.num_speculative_tokens),
                 tuple(args.cpu_kv), tuple(args.cpu_weights), args.deterministic)
    for label, row in report["decoding"].items():
        print(f"{label:>16}: tok/verify {row['tokens_per_verify_step']:.2f} "
              f"WER {row['wer']:.3f} sim {row['speaker_similarity']:.3f}")
    for spec, row in report["tables"].items():
        sw = row["swap_test"]
        print(f"{spec:>10}: |G| {sw['mean_seed_group']:.1f} swapped {sw['swapped_share']:.2f} "
              f"ΔWER {sw['delta_wer']:+.3f} Δsim {sw['delta_similarity']:+.3f}")
    return 0
