"""The shipped ASG table: groups from the target's input-embedding rows of the speech tokens, θ by sweep.

For each θ of the sweep the report gives the mean seed-group size and the groups' acoustic coherence: the
mean distance between the codec centroids (log-mel) of a token and its group members, as a share of the
mean distance between random tokens. θ is the most permissive value whose groups stay acoustically
coherent (coherence <= COHERENCE_LIMIT) and small (mean seed group <= MAX_MEAN_GROUP).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from asg_tables import build_asg
from asg_tables.build import seed_group_sizes
from asg_tables.embeddings import read_embedding_rows
from asg_tables.report import table_stats
from engine.speech.demo.layout import DemoVocab

THETAS = [0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7, 0.8]
EXTRA_STEPS = (-2, 2)  # extra tables shipped for θ A/B tests: this many sweep steps either side of θ
COHERENCE_LIMIT = 0.6
MAX_MEAN_GROUP = 24.0


def coherence(unit: torch.Tensor, centroids: torch.Tensor, theta: float) -> float:
    """Mean centroid distance token->other group members over the mean distance between all tokens."""
    sim = unit @ unit.T  # [K, K]
    dist = torch.cdist(centroids, centroids)  # [K, K]
    member = (sim >= theta) & ~torch.eye(len(unit), dtype=torch.bool)
    if not member.any():
        return 0.0
    return float(dist[member].mean() / dist[~torch.eye(len(unit), dtype=torch.bool)].mean())


def build_table(model_dir: Path, vocab: DemoVocab) -> dict:
    rows, meta = read_embedding_rows(model_dir / "target", vocab.code_offset, vocab.codebook_size)
    emb = rows.float()  # [K, D]
    unit = torch.nn.functional.normalize(emb, dim=1)
    centroids = load_file(model_dir / "codec" / "codebook.safetensors")["codebook"].float()
    sizes = seed_group_sizes(emb, THETAS, progress=False).double()  # [len(THETAS), K]
    sweep = [{"theta": th, "mean_seed_group": float(sizes[i].mean()),
              "median_seed_group": float(sizes[i].median()), "coherence": coherence(unit, centroids, th)}
             for i, th in enumerate(THETAS)]
    ok = [r for r in sweep if r["coherence"] <= COHERENCE_LIMIT and r["mean_seed_group"] <= MAX_MEAN_GROUP]
    theta = min(r["theta"] for r in ok) if ok else max(THETAS)
    table = build_asg(emb, theta, offset=vocab.code_offset, vocab_size=vocab.vocab_size, progress=False,
                      meta=meta | {"rule": f"smallest θ with coherence <= {COHERENCE_LIMIT} and mean seed "
                                           f"group <= {MAX_MEAN_GROUP}"})
    table.save(model_dir / "asg.safetensors")
    stats = table_stats(table)
    extra = {}
    for step in EXTRA_STEPS:
        i = THETAS.index(theta) + step
        if 0 <= i < len(THETAS):
            name = f"theta-{THETAS[i]}"
            build_asg(emb, THETAS[i], offset=vocab.code_offset, vocab_size=vocab.vocab_size, progress=False,
                      meta=meta | {"rule": "θ A/B alternative"}).save(model_dir / f"asg-{name}.safetensors")
            extra[name] = f"asg-{name}.safetensors"
    report = {"theta": theta, "sweep": sweep, "stats": {k: v for k, v in stats.items() if k != "meta"},
              "extra_tables": extra}
    (model_dir / "asg_report.json").write_text(json.dumps(report, indent=1))
    print(f"[asg] θ={theta}: " + ", ".join(f"{r['theta']}:{r['mean_seed_group']:.1f}/{r['coherence']:.2f}"
                                          for r in sweep), flush=True)
    return report
