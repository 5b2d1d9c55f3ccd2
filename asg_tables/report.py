"""Statistics and a PNG plot of an ASG table, for picking θ and checking a build."""

from __future__ import annotations

from pathlib import Path

import torch
from pcgtts.asg_tables.table import ASGTable


def speech_range(table: ASGTable) -> tuple[int, int]:
    """[start, end) of the tokens the groups were built over (the whole vocabulary if unknown)."""
    start = int(table.meta.get("offset", 0))
    return start, start + int(table.meta.get("num_tokens", table.vocab_size - start))


def speech_group_ids(table: ASGTable) -> torch.Tensor:
    """Groups holding at least one token of the speech range."""
    start, end = speech_range(table)
    index = table.index()
    return torch.unique(index.token_groups[index.token_indptr[start] : index.token_indptr[end]])


def histogram(values: torch.Tensor) -> dict[str, int]:
    """Counts in power-of-two bins: '1', '2-3', '4-7', ..."""
    out: dict[str, int] = {}
    values = values.long()
    lo = 1
    while values.numel() and lo <= int(values.max()):
        hi = 2 * lo - 1
        n = int(((values >= lo) & (values <= hi)).sum())
        if n:
            out[str(lo) if lo == hi else f"{lo}-{hi}"] = n
        lo *= 2
    return out


def table_stats(table: ASGTable) -> dict:
    start, end = speech_range(table)
    groups = speech_group_ids(table)
    sizes = table.group_sizes()[groups].double()
    owners = table.num_owners[start:end]
    seed_sizes = None
    if table.seed_group is not None:
        seed_sizes = table.group_sizes()[table.seed_group[start:end].long()].double()
    # a token is covered when some group holding it has another member
    token_of_entry = torch.repeat_interleave(torch.arange(table.vocab_size), table.num_owners)
    largest = torch.zeros(table.vocab_size, dtype=torch.long).scatter_reduce_(
        0, token_of_entry, table.group_sizes()[table.index().token_groups], reduce="amax"
    )
    covered = largest[start:end] > 1
    return {
        "vocab_size": table.vocab_size,
        "speech_range": [start, end],
        "num_groups": table.num_groups,
        "num_speech_groups": int(groups.numel()),
        "nnz": int(table.group_members.numel()),
        "group_size": {"mean": float(sizes.mean()), "median": float(sizes.median()), "max": int(sizes.max())},
        "mean_seed_group_size": None if seed_sizes is None else float(seed_sizes.mean()),
        "owners_per_token": {"mean": float(owners.double().mean()), "max": int(owners.max())},
        "coverage": float(covered.double().mean()),
        "singleton_groups": int((sizes == 1).sum()),
        "memory_bytes": table.nbytes(),
        "group_size_histogram": histogram(sizes),
        "owners_histogram": histogram(owners),
        "meta": table.meta,
    }


def format_stats(stats: dict) -> str:
    g, o = stats["group_size"], stats["owners_per_token"]
    start, end = stats["speech_range"]
    lines = [
        f"vocabulary {stats['vocab_size']}, speech tokens {start}..{end - 1}",
        f"θ = {stats['meta'].get('theta')}, groups over speech tokens {stats['num_speech_groups']} "
        f"(singletons {stats['singleton_groups']}), all groups {stats['num_groups']}",
        f"group size mean {g['mean']:.2f}, median {g['median']:.0f}, max {g['max']}",
        f"groups per token N(t): mean {o['mean']:.2f}, max {o['max']}",
        f"coverage (speech tokens in a shared group) {100 * stats['coverage']:.1f}%",
        f"memory {stats['memory_bytes'] / 2**20:.2f} MiB ({stats['nnz']} members)",
        "group size histogram: " + ", ".join(f"{k}: {v}" for k, v in stats["group_size_histogram"].items()),
        "N(t) histogram: " + ", ".join(f"{k}: {v}" for k, v in stats["owners_histogram"].items()),
    ]
    return "\n".join(lines)


def plot_stats(table: ASGTable, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start, end = speech_range(table)
    sizes = table.group_sizes()[speech_group_ids(table)].numpy()
    owners = table.num_owners[start:end].numpy()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, data, title in ((axes[0], sizes, "group size |G_k|"), (axes[1], owners, "groups per token N(t)")):
        top = max(int(data.max()), 1)
        bins = sorted({int(round(2 ** (i / 4))) for i in range(0, int(4 * top.bit_length()) + 1)} | {top + 1})
        ax.hist(data, bins=bins)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(title)
        ax.set_ylabel("count")
    fig.suptitle(f"ASG table θ={table.meta.get('theta')}: {len(sizes)} groups, mean size {sizes.mean():.1f}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
