"""Why does PCG accept little more than exact? Rejections broken down, and ASG tables compared on them.

Decodes held-out-style sentences with the bundle's draft and target under exact speculative sampling
(γ=3, T=0.8) and records every verified position: its place in the draft window, the draft token, whether it
was accepted, the token the target put in its place on a rejection, and the draft and target distributions
(constrained and tempered, as the rule saw them). From those records:

* acceptance by draft position and by token class of the draft token (phoneme marker, code, `<end>`),
  and the share of positions the decode constraint forces (both models give one token probability 1);
* rejections by acoustic distance: the log-mel distance between the codec centroids of the rejected draft
  code and the code the target sampled instead, as a share of the mean distance between codes; whether that
  replacement lies in the draft token's group; and the expected distance between the draft's excess mass
  (p - q)+ and the target's (q - p)+ at every verified code position;
* per-token acceptance α = Σ min(p, q) (exact) against Σ_k min(P_c, Q_c) (PCG) for ASG tables from the
  target's input embeddings (cosine θ, the paper's construction) and from the codec's centroids (L2 radius
  as a share of the mean centroid distance), with mean group sizes: how much each grouping could accept on
  the very distributions the engine produced.

    pcgtts bench rejections [--sentences 16] [--out bench/results]

Writes OUT/rejections.json (and prints a summary).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from pcgtts.asg_tables import ASGTable, build_asg
from pcgtts.asg_tables.embeddings import read_embedding_rows
from pcgtts.bench.common import SENTENCES, DecodeTally, machine, ratio, shown_path, write_json
from pcgtts.engine import Engine, EngineConfig, SamplingParams
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle

NUM_SPECULATIVE_TOKENS = 3
EMBEDDING_THETAS = (0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6)
ACOUSTIC_FRACTIONS = (0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55)  # L2 radius / mean distance between centroids


@dataclass
class Records:
    """Every verified position of every speculative step (positions after a rejection are not verified)."""

    position: list[int] = field(default_factory=list)
    draft_token: list[int] = field(default_factory=list)
    accepted: list[bool] = field(default_factory=list)
    replacement: list[int] = field(default_factory=list)  # the target's token on a rejection, else -1
    draft_probs: list[torch.Tensor] = field(default_factory=list)  # [V] rows
    target_probs: list[torch.Tensor] = field(default_factory=list)


class RecordingRule:
    """Wraps an acceptance rule; records what `verify` saw and decided, decides nothing itself."""

    def __init__(self, rule, records: Records):
        self.rule, self.records = rule, records

    def verify(self, draft_tokens, draft_probs, target_probs, generator=None):
        verdict = self.rule.verify(draft_tokens, draft_probs, target_probs, generator)
        rec = self.records
        for b, n in enumerate(verdict.num_accepted.tolist()):
            for i in range(min(n + 1, draft_tokens.shape[1])):
                rec.position.append(i)
                rec.draft_token.append(int(draft_tokens[b, i]))
                rec.accepted.append(i < n)
                rec.replacement.append(int(verdict.tokens[b, i]) if i == n else -1)
                rec.draft_probs.append(draft_probs[b, i].float().clone())
                rec.target_probs.append(target_probs[b, i].float().clone())
        return verdict


def record_exact(bundle: ModelBundle, texts: list[str], seeds: list[int], temperature: float,
                 max_tokens: int) -> tuple[Records, list[list[int]], dict]:
    family = bundle.load_family()
    engine = Engine(EngineConfig(target=bundle.target_dir, draft=bundle.draft_dir, acceptance="exact",
                                 num_speculative_tokens=NUM_SPECULATIVE_TOKENS))
    records = Records()
    # bench hook: the engine's cached exact rule, wrapped so that every verify is recorded
    engine.rules._rules[("exact", None)] = RecordingRule(engine.rules.get("exact"), records)  # noqa: SLF001
    voices = sorted(family.voices)
    prompts, params = [], []
    for seed in seeds:
        for i, text in enumerate(texts):
            prompt = family.build_prompt(text, family.voices[voices[i % len(voices)]])
            prompts.append(prompt.token_ids)
            params.append(SamplingParams(temperature=temperature, max_tokens=max_tokens,
                                         stop_token_ids=prompt.stop_token_ids, seed=seed * 1000 + i,
                                         constraint=prompt.constraint))
    start = time.perf_counter()
    gens = engine.generate(prompts, params)
    run = {"wall_s": time.perf_counter() - start, **DecodeTally.of(gens).fields()}
    return records, [g.token_ids for g in gens], run


def token_class(vocab, token: int) -> str:
    if token == vocab_end(vocab):
        return "end"
    if vocab.code_offset <= token < vocab.vocab_size:
        return "code"
    if token in vocab.marker_ids:
        return "marker"
    return "other"


def vocab_end(vocab) -> int:
    from pcgtts.engine.speech.demo.layout import SPECIAL_NAMES

    return SPECIAL_NAMES.index("<end>")


def breakdown(rec: Records, vocab, centroids: torch.Tensor, table: ASGTable) -> dict:
    """Acceptance by position and class; rejections by acoustic distance of draft vs replacement."""
    off = vocab.code_offset
    dist = torch.cdist(centroids, centroids)  # [K, K] log-mel distance between codes
    mean_dist = float(dist[~torch.eye(len(dist), dtype=torch.bool)].mean())
    by_position = {}
    for i in range(NUM_SPECULATIVE_TOKENS):
        idx = [k for k, p in enumerate(rec.position) if p == i]
        by_position[str(i + 1)] = {"verified": len(idx), "accepted": sum(rec.accepted[k] for k in idx),
                                   "acceptance_rate": ratio(sum(rec.accepted[k] for k in idx), len(idx))}
    by_class: dict[str, dict] = {}
    for k, tok in enumerate(rec.draft_token):
        c = by_class.setdefault(token_class(vocab, tok), {"verified": 0, "accepted": 0, "forced": 0})
        c["verified"] += 1
        c["accepted"] += rec.accepted[k]
        c["forced"] += bool(rec.target_probs[k].max() >= 1 - 1e-6)
    for c in by_class.values():
        c["acceptance_rate"] = ratio(c["accepted"], c["verified"])
    pairs: dict[str, int] = {}
    code_rej = []
    for k, rep in enumerate(rec.replacement):
        if rep < 0:
            continue
        a, b = token_class(vocab, rec.draft_token[k]), token_class(vocab, rep)
        pairs[f"{a}->{b}"] = pairs.get(f"{a}->{b}", 0) + 1
        if a == b == "code":
            code_rej.append((rec.draft_token[k] - off, rep - off))
    rejections = {"by_class_pair": pairs}
    if code_rej:
        d, r = torch.tensor(code_rej).T
        rel = dist[d, r] / mean_dist
        same_group = [bool(torch.isin(table.groups_of(int(x) + off), table.groups_of(int(y) + off)).any())
                      for x, y in code_rej]
        nearest = torch.sort(dist, dim=1).values  # [K, K]: distances to the 1st, 2nd, ... nearest code
        rejections["code_to_code"] = {
            "count": len(code_rej),
            "replacement_same_token": float((d == r).double().mean()),
            "distance_over_mean": {"median": float(rel.median()), "mean": float(rel.mean()),
                                   "p25": float(rel.quantile(0.25)), "p75": float(rel.quantile(0.75))},
            "share_within_nearest_10_codes": float((dist[d, r] <= nearest[d, 10]).double().mean()),
            "share_in_a_shared_group_of_bundle_table": sum(same_group) / len(same_group),
            "mean_distance_to_10th_nearest_over_mean": float(nearest[:, 10].mean() / mean_dist),
        }
    return {"by_position": by_position, "by_draft_class": by_class, "rejections": rejections,
            "mean_centroid_distance": mean_dist}


def code_rows(rec: Records, vocab) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft and target rows [R, V] of verified positions that are not forced by the constraint."""
    p, q = torch.stack(rec.draft_probs), torch.stack(rec.target_probs)
    free = q.max(dim=1).values < 1 - 1e-6
    return p[free], q[free]


def mismatch_distance(p: torch.Tensor, q: torch.Tensor, vocab, centroids: torch.Tensor) -> dict:
    """E d(x, y) for x ~ (p - q)+ and y ~ (q - p)+ over code tokens, as a share of the mean distance: how
    far, acoustically, the draft's surplus lies from the target's at each step (1.0 = as far as random)."""
    off, k = vocab.code_offset, centroids.shape[0]
    dist = torch.cdist(centroids, centroids)
    mean_dist = float(dist[~torch.eye(k, dtype=torch.bool)].mean())
    a = (p[:, off:off + k] - q[:, off:off + k]).clamp(min=0)
    b = (q[:, off:off + k] - p[:, off:off + k]).clamp(min=0)
    keep = (a.sum(1) > 1e-4) & (b.sum(1) > 1e-4)
    a = a[keep] / a[keep].sum(1, keepdim=True)
    b = b[keep] / b[keep].sum(1, keepdim=True)
    expected = ((a @ dist) * b).sum(1) / mean_dist  # [R]
    # for scale: the same expectation between the target's distribution and itself
    qn = q[keep, off:off + k] / q[keep, off:off + k].sum(1, keepdim=True)
    spread = ((qn @ dist) * qn).sum(1) / mean_dist
    return {"rows": int(keep.sum()), "surplus_distance_over_mean": float(expected.mean()),
            "target_self_spread_over_mean": float(spread.mean())}


def coarse_alpha(table: ASGTable, p: torch.Tensor, q: torch.Tensor) -> float:
    """Mean Σ_k min(P_c, Q_c): PCG's per-token acceptance probability on these rows."""
    return float(torch.minimum(table.coarse(p), table.coarse(q)).sum(1).mean())


def tables_for(bundle: ModelBundle, vocab, centroids: torch.Tensor) -> list[tuple[str, dict, ASGTable]]:
    rows, _ = read_embedding_rows(bundle.target_dir, vocab.code_offset, vocab.codebook_size)
    dist = torch.cdist(centroids, centroids)
    mean_dist = float(dist[~torch.eye(len(dist), dtype=torch.bool)].mean())
    out = []
    for th in EMBEDDING_THETAS:
        t = build_asg(rows, th, offset=vocab.code_offset, vocab_size=vocab.vocab_size, progress=False)
        out.append((f"embedding cos θ={th}", {"grouping": "embedding", "theta": th}, t))
    for f in ACOUSTIC_FRACTIONS:
        t = build_asg(centroids, f * mean_dist, offset=vocab.code_offset, vocab_size=vocab.vocab_size,
                      progress=False, metric="l2")
        out.append((f"acoustic L2 ≤ {f}·mean", {"grouping": "acoustic", "radius_fraction": f}, t))
    return out


def coherence(table: ASGTable, vocab, centroids: torch.Tensor) -> float:
    """Mean centroid distance between a token and the other members of its seed group, over the mean
    distance between codes (1.0: groups as mixed as random)."""
    off, k = vocab.code_offset, centroids.shape[0]
    dist = torch.cdist(centroids, centroids)
    mean_dist = float(dist[~torch.eye(k, dtype=torch.bool)].mean())
    total, n = 0.0, 0
    for t in range(k):
        members = table.members(int(table.seed_group[t + off])) - off
        members = members[members != t]
        total += float(dist[t, members].sum())
        n += len(members)
    return total / n / mean_dist if n else 0.0


def run(model_dir: Path, out_dir: Path, sentences: int, seeds: list[int], temperature: float,
        max_tokens: int) -> dict:
    torch.set_num_threads(1)
    bundle = ModelBundle.from_dir(model_dir)
    family, codec = bundle.load_family(), bundle.load_codec()
    vocab, centroids = family.vocab, codec.codebook
    texts = (SENTENCES * 4)[:sentences]
    rec, _, engine_run = record_exact(bundle, texts, seeds, temperature, max_tokens)
    table = ASGTable.load(bundle.asg_table)
    report = {"model": shown_path(model_dir), "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
              "temperature": temperature,
              "sentences": len(texts),
              "seeds": seeds, "engine_run": engine_run, "machine": machine(),
              "bundle_table": {k: table.meta.get(k) for k in ("theta", "metric", "mean_seed_group_size")}}
    report |= breakdown(rec, vocab, centroids, table)
    p, q = code_rows(rec, vocab)
    report["unforced_positions"] = int(p.shape[0])
    report["surplus"] = mismatch_distance(p, q, vocab, centroids)
    report["alpha_exact"] = float(torch.minimum(p, q).sum(1).mean())
    sweep = []
    for label, params, t in tables_for(bundle, vocab, centroids):
        sizes = t.group_sizes()[t.seed_group[vocab.code_offset:vocab.vocab_size].long()].double()
        sweep.append({"label": label, **params, "mean_seed_group": float(sizes.mean()),
                      "coherence": coherence(t, vocab, centroids), "alpha_pcg": coarse_alpha(t, p, q)})
    sweep.append({"label": "bundle table", "grouping": "bundle", "alpha_pcg": coarse_alpha(table, p, q)})
    report["alpha_by_table"] = sweep
    write_json(out_dir / "rejections.json", report)
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR, help="model bundle directory")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="output directory")
    parser.add_argument("--sentences", type=int, default=16)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--max-tokens", type=int, default=800)


def main(args: argparse.Namespace) -> int:
    report = run(args.model, args.out, args.sentences, args.seeds, args.temperature, args.max_tokens)
    print(json.dumps({k: report[k] for k in ("by_position", "by_draft_class", "rejections", "surplus",
                                              "alpha_exact")}, indent=1))
    for row in report["alpha_by_table"]:
        print(f"{row['label']:>28}: α={row['alpha_pcg']:.3f} mean group {row.get('mean_seed_group', 0):.1f} "
              f"coherence {row.get('coherence', 0):.2f}")
    return 0
