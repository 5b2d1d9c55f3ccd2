"""The shipped ASG tables: groups from the target's input-embedding rows of the speech tokens (the paper's
construction, cosine θ) and acoustic groups from the codec's centroids (log-mel L2 distance within a
radius, given as a share of the mean distance between centroids), both made by `build_asg`.

For each θ / radius the report gives the mean seed-group size and the groups' acoustic coherence: the mean
distance between the codec centroids (log-mel) of a token and its group members, as a share of the mean
distance between random tokens. The default table and the extra ones (selectable per request by name) are
DEFAULT_TABLE and EXTRA_TABLES, chosen by `pcgtts bench rejections` and `pcgtts bench groups`
(bench/results/rejections.json, groups.json; models/demo-en/EVAL.md): the acoustic groups accept more than
embedding groups of the same size on the same steps, at the best speed within ΔWER <= +0.05 of target-only.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from pcgtts.asg_tables import ASGTable, build_asg
from pcgtts.asg_tables.build import seed_group_sizes
from pcgtts.asg_tables.embeddings import read_embedding_rows
from pcgtts.engine.speech.demo.layout import DemoVocab
from safetensors.torch import load_file

THETAS = [0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7, 0.8]
RADIUS_FRACTIONS = [0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6]
# (grouping, value): "embedding" -> cosine θ; "acoustic" -> radius as a share of the mean centroid distance
DEFAULT_TABLE = ("acoustic", 0.35)
EXTRA_TABLES = (("embedding", 0.55), ("embedding", 0.45), ("acoustic", 0.4), ("acoustic", 0.5))


def table_name(grouping: str, value: float) -> str:
    """Per-request table names: `theta-θ` (embedding groups, as before) and `mel-f` (acoustic groups)."""
    return f"theta-{value}" if grouping == "embedding" else f"mel-{value}"


def mean_offdiagonal(matrix: torch.Tensor) -> float:
    return float(matrix[~torch.eye(len(matrix), dtype=torch.bool)].mean())


def coherence(member: torch.Tensor, dist: torch.Tensor) -> float:
    """Mean centroid distance token->other group members over the mean distance between all tokens.
    member: Bool[K, K] (t' ∈ G(t)); dist: [K, K] centroid distances."""
    member = member & ~torch.eye(len(member), dtype=torch.bool)
    return float(dist[member].mean() / mean_offdiagonal(dist)) if member.any() else 0.0


class GroupSources:
    """The two matrices groups are built from, for one bundle: embedding rows [K, D] and centroids [K, 80]."""

    def __init__(self, model_dir: Path, vocab: DemoVocab):
        rows, self.meta = read_embedding_rows(model_dir / "target", vocab.code_offset, vocab.codebook_size)
        self.emb = rows.float()  # [K, D]
        codebook = load_file(model_dir / "codec" / "codebook.safetensors")
        self.centroids = codebook["codebook"].float()  # [K, 80] log-mel
        self.dist = torch.cdist(self.centroids, self.centroids)  # [K, K]
        self.mean_dist = mean_offdiagonal(self.dist)
        self.vocab = vocab

    def build(self, grouping: str, value: float, rule: str) -> ASGTable:
        v = self.vocab
        if grouping == "embedding":
            return build_asg(self.emb, value, offset=v.code_offset, vocab_size=v.vocab_size, progress=False,
                             meta=self.meta | {"grouping": "embedding", "name": table_name(grouping, value),
                                               "rule": rule})
        return build_asg(self.centroids, value * self.mean_dist, offset=v.code_offset,
                         vocab_size=v.vocab_size, progress=False, metric="l2",
                         meta={"grouping": "acoustic", "source": "codec/codebook.safetensors",
                               "radius_fraction": value, "name": table_name(grouping, value), "rule": rule})

    def sweep(self) -> dict[str, list[dict]]:
        unit = torch.nn.functional.normalize(self.emb, dim=1)
        cos = unit @ unit.T
        emb_sizes = seed_group_sizes(self.emb, THETAS, progress=False).double()  # [len(THETAS), K]
        radii = [f * self.mean_dist for f in RADIUS_FRACTIONS]
        mel_sizes = seed_group_sizes(self.centroids, radii, progress=False, metric="l2").double()
        return {
            "embedding": [{"theta": th, "mean_seed_group": float(emb_sizes[i].mean()),
                           "median_seed_group": float(emb_sizes[i].median()),
                           "coherence": coherence(cos >= th, self.dist)} for i, th in enumerate(THETAS)],
            "acoustic": [{"radius_fraction": f, "mean_seed_group": float(mel_sizes[i].mean()),
                          "median_seed_group": float(mel_sizes[i].median()),
                          "coherence": coherence(self.dist <= f * self.mean_dist, self.dist)}
                         for i, f in enumerate(RADIUS_FRACTIONS)],
        }


def build_table(model_dir: Path, vocab: DemoVocab) -> dict:
    """Write asg.safetensors (DEFAULT_TABLE), the EXTRA_TABLES and asg_report.json into the bundle;
    returns the report, whose `extra_tables` maps request names to files."""
    sources = GroupSources(model_dir, vocab)
    sweep = sources.sweep()
    default = sources.build(*DEFAULT_TABLE, rule="bundle default (models/demo-en/EVAL.md: groups)")
    default.save(model_dir / "asg.safetensors")
    extra = {}
    for grouping, value in EXTRA_TABLES:
        name = table_name(grouping, value)
        sources.build(grouping, value, rule="A/B alternative").save(model_dir / f"asg-{name}.safetensors")
        extra[name] = f"asg-{name}.safetensors"
    report = {"default": {"grouping": DEFAULT_TABLE[0], "value": DEFAULT_TABLE[1],
                          "name": table_name(*DEFAULT_TABLE)},
              "mean_centroid_distance": sources.mean_dist, "sweep": sweep,
              "stats": {k: v for k, v in default.meta.items() if k != "meta"}, "extra_tables": extra}
    (model_dir / "asg_report.json").write_text(json.dumps(report, indent=1))
    print("[asg] " + "; ".join(f"{g}: " + ", ".join(f"{r.get('theta', r.get('radius_fraction'))}:"
                                                     f"{r['mean_seed_group']:.1f}/{r['coherence']:.2f}"
                                                     for r in rows) for g, rows in sweep.items()), flush=True)
    return report
