"""Which draft-only signal should stop a row's drafting (issue 31 §1), measured on the bundle's draft blocks.

    python bench/results/draft-length/stopping_rules.py --num-speculative-tokens 8 --utterances 60 \
        --verdicts 16 --out bench/results/draft-length/stopping-rules

An engine with the shipped bundle (feature-head draft, PCG over its ASG table, γ = --num-speculative-tokens,
eager CPU) decodes the bundle's speech prompts in batches of 6 (T = 0.8, seeded), and every speculative step's
inputs are kept (draft tokens [B, γ], draft probs [B, γ, V], target probs [B, γ+1, V];
bench/bundle_verify.py's capture). Each kept row is verified `--verdicts` times by the rule (PCG, and exact),
each with its own seed, which gives k, the drafts the rule accepts out of all γ.

A stopping rule verifies a row's first L drafts (L from the draft alone) and the row then emits min(k, L) + 1
tokens: the rule verifies position by position, so the verdicts on the first L drafts and the token after
them are those of the full block. So every rule's tokens per verify step and mean L come from the same
verdicts. Rules, each with a threshold θ (a quantile of its signal, so the rules are compared at like
lengths) and a γ_max:

    fixed           L = γ_max
    previous token  the draft's probability of its previous proposal, p_{j-1}(x_{j-1}) ≥ θ to verify x_j (the
                    engine's first draft-confidence rule)
    next top        max_t p_j(t) ≥ θ: the draft's top probability at x_j's position (the engine's rule now)
    next entropy    -H(p_j) ≥ θ
    next group top  the top of p_j's coarse distribution over ASG groups (PCG accepts at group level)

Each signal's area under the ROC curve for "the target accepts x_j", among rows whose verdicts reach
position j (majority over the verdicts), says how much it knows. Writes OUT/stopping_rules.json, .md, .png.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from pcgtts.asg_tables import ASGTable
from pcgtts.bench.bundle_verify import capture_steps
from pcgtts.bench.common import bundle_engine, machine, speech_requests, write_json
from pcgtts.engine.acceptance import make_rule
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle

QUANTILES = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5)


def signals(drafts: torch.Tensor, draft_probs: torch.Tensor, table: ASGTable) -> dict[str, torch.Tensor]:
    """Per row and position j (Float[B, γ]): what the draft knows before deciding to verify x_j."""
    b, g, _ = draft_probs.shape
    own = draft_probs.gather(2, drafts[..., None])[..., 0]  # p_j(x_j)
    coarse = table.coarse(draft_probs.reshape(b * g, -1).double()).reshape(b, g, -1).float()
    return {"previous token": torch.cat([torch.ones(b, 1), own[:, :-1]], dim=1),
            "next top": draft_probs.amax(dim=2),
            "next entropy": (draft_probs * draft_probs.clamp_min(1e-12).log()).sum(dim=2),
            "next group top": coarse.amax(dim=2)}


def verdicts(rule, steps, count: int) -> torch.Tensor:
    """Long[rows, count]: drafts accepted out of each kept row's full block, `count` seeds."""
    out = []
    for drafts, draft_probs, target_probs in steps:
        out.append(torch.stack([rule.verify(drafts, draft_probs, target_probs,
                                            torch.Generator().manual_seed(seed)).num_accepted
                                for seed in range(count)], dim=1))
    return torch.cat(out)


def auc(score: torch.Tensor, positive: torch.Tensor) -> float:
    """Area under the ROC curve of `score` for the Bool `positive` labels (Mann-Whitney, ties by order)."""
    ranks = torch.empty(len(score))
    ranks[score.argsort()] = torch.arange(len(score), dtype=torch.float)
    n1, n0 = int(positive.sum()), int((~positive).sum())
    return float((ranks[positive].sum() - n1 * (n1 - 1) / 2) / (n1 * n0))


def lengths(signal: torch.Tensor, threshold: float, gamma_max: int) -> torch.Tensor:
    """L per row: 1 + the leading positions 2..γ_max whose signal is at least the threshold."""
    sure = signal[:, 1:gamma_max] >= threshold
    return 1 + torch.cumprod(sure.long(), dim=1).sum(dim=1)


def evaluate(accepted: torch.Tensor, sig: dict[str, torch.Tensor], gamma: int) -> dict:
    rows = []
    for gamma_max in range(1, gamma + 1):
        length = torch.full((accepted.shape[0],), gamma_max)
        rows.append(row("fixed", gamma_max, None, accepted, length))
    for name, signal in sig.items():
        for q in QUANTILES:
            threshold = float(torch.quantile(signal[:, 1:].flatten(), q))
            for gamma_max in (5, 6, gamma):
                rows.append(row(name, gamma_max, threshold, accepted, lengths(signal, threshold, gamma_max)))
    aucs = {}
    for j in range(1, min(gamma, 7)):
        reached = (accepted >= j).float().mean(dim=1) > 0.5
        label = (accepted[reached] >= j + 1).float().mean(dim=1) > 0.5
        aucs[f"position {j + 1}"] = {name: round(auc(signal[reached, j], label), 3)
                                     for name, signal in sig.items()}
    per_position = [round(float((accepted >= j + 1).sum() / (accepted >= j).sum()), 3) for j in range(gamma)]
    return {"rows": rows, "auc": aucs, "acceptance_given_reached": per_position}


def row(name: str, gamma_max: int, threshold: float | None, accepted: torch.Tensor,
        length: torch.Tensor) -> dict:
    tokens = torch.minimum(accepted, length[:, None]).float().mean() + 1
    return {"rule": name, "gamma_max": gamma_max,
            "threshold": None if threshold is None else round(threshold, 4),
            "tokens_per_verify_step": round(float(tokens), 3),
            "mean_length": round(float(length.float().mean()), 3)}


def gain_over_fixed(result: dict) -> dict:
    """Per signal: the largest gain in tokens per step over fixed γ at the same mean L (fixed, interpolated)
    -> {signal: (gain, its row)}."""
    fixed = sorted((r["mean_length"], r["tokens_per_verify_step"])
                   for r in result["rows"] if r["rule"] == "fixed")

    def at(length: float) -> float:
        for (l0, t0), (l1, t1) in zip(fixed, fixed[1:], strict=False):
            if l0 <= length <= l1:
                return t0 + (t1 - t0) * (length - l0) / (l1 - l0)
        return fixed[-1][1]

    best = {}
    for r in result["rows"]:
        if r["rule"] != "fixed":
            gain = r["tokens_per_verify_step"] - at(r["mean_length"])
            if gain > best.get(r["rule"], (-9,))[0]:
                best[r["rule"]] = (round(gain, 3), r)
    return best


def markdown(result: dict, command: str) -> str:
    lines = [f"# Stopping rules on the bundle's draft blocks (`{command}`)", "",
             f"Machine: {result['machine']}. {result['kept_rows']} kept rows of γ = "
             f"{result['num_speculative_tokens']} drafts, "
             f"{result['verdicts']} verdicts each.", ""]
    for rule_name, part in result["rules"].items():
        lines += [f"## {rule_name}", "",
                  "Acceptance of position j among rows whose drafts were all accepted before it: "
                  + ", ".join(f"{a:.2f}" for a in part["acceptance_given_reached"]), "",
                  "Area under the ROC curve for 'x_j accepted' (rows that reach j):", "",
                  "| position | " + " | ".join(next(iter(part["auc"].values()))) + " |",
                  "| --- |" + " --- |" * len(next(iter(part["auc"].values())))]
        for pos, values in part["auc"].items():
            lines.append(f"| {pos} | " + " | ".join(f"{v:.3f}" for v in values.values()) + " |")
        lines += ["", "Best gain in tokens per verify step over fixed γ at the same mean L: "
                  + "; ".join(f"{name} {gain:+.3f} (γ_max {r['gamma_max']}, θ {r['threshold']}, "
                              f"{r['tokens_per_verify_step']} at L {r['mean_length']})"
                              for name, (gain, r) in part["best_gain"].items()), "",
                  "| rule | γ_max | θ | tokens per verify step | mean L |", "| --- | --- | --- | --- | --- |"]
        for r in sorted(part["rows"], key=lambda r: (r["rule"], r["gamma_max"], r["mean_length"])):
            lines.append(f"| {r['rule']} | {r['gamma_max']} | {r['threshold']} | "
                         f"{r['tokens_per_verify_step']} | {r['mean_length']} |")
        lines.append("")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = result["rules"]
    fig, axes = plt.subplots(1, len(parts), figsize=(6 * len(parts), 4.5), squeeze=False)
    for ax, (rule_name, part) in zip(axes[0], parts.items(), strict=True):
        names = sorted({r["rule"] for r in part["rows"]})
        for name in names:
            points = sorted((r["mean_length"], r["tokens_per_verify_step"])
                            for r in part["rows"] if r["rule"] == name)
            style = "k-o" if name == "fixed" else "."
            ax.plot(*zip(*points, strict=True), style, label=name)
        ax.set_xlabel("drafts verified per row and step (mean L)")
        ax.set_ylabel("tokens per verify step")
        ax.set_title(f"{rule_name}: stopping rules against fixed γ")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--num-speculative-tokens", type=int, default=8)
    parser.add_argument("--utterances", type=int, default=60)
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--verdicts", type=int, default=16)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = ModelBundle.from_dir(args.model)
    table = ASGTable.load(bundle.asg_table)
    engine = bundle_engine(bundle, "pcg", num_speculative_tokens=args.num_speculative_tokens)
    prompts, params = speech_requests(bundle, args.utterances, 0.8, args.max_tokens, seed=100)
    steps = capture_steps(engine, prompts, params, 6)
    per_step = [signals(drafts, draft_probs, table) for drafts, draft_probs, _ in steps]
    sig = {name: torch.cat([step[name] for step in per_step]) for name in per_step[0]}
    result = {"machine": machine(), "num_speculative_tokens": args.num_speculative_tokens,
              "utterances": args.utterances, "max_tokens": args.max_tokens, "verdicts": args.verdicts,
              "kept_rows": sum(d.shape[0] for d, _, _ in steps), "rules": {}}
    for rule_name, rule in (("pcg", make_rule("pcg", table=table)), ("exact", make_rule("exact"))):
        part = evaluate(verdicts(rule, steps, args.verdicts), sig, args.num_speculative_tokens)
        part["best_gain"] = gain_over_fixed(part)
        result["rules"][rule_name] = part
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "stopping_rules.json", result)
    command = ("python bench/results/draft-length/stopping_rules.py "
               f"--num-speculative-tokens {args.num_speculative_tokens} --utterances {args.utterances} "
               f"--verdicts {args.verdicts}")
    (args.out / "stopping_rules.md").write_text(markdown(result, command))
    plot(result, args.out / "stopping_rules.png")
    print(json.dumps({k: v["best_gain"] for k, v in result["rules"].items()}, indent=1))


if __name__ == "__main__":
    main()
