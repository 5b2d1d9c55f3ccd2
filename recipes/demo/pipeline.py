"""The demo-model recipe as stages; `pcgtts recipe demo` runs them in order, each resumable.

Stages: corpus -> prepare (codebook, codes, vocabulary) -> train (target LM) -> decoder (codec conv
decoder) -> draft (distilled 1-layer draft) -> voices (preset voices) -> bundle (export + ASG table) ->
eval. Working files live in the run directory (git-ignored); the bundle is written to the model directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

STAGES = ["corpus", "prepare", "train", "decoder", "draft", "voices", "bundle", "eval"]


@dataclass
class RecipeConfig:
    run_dir: Path = Path("runs/demo")
    model_dir: Path = Path("models/demo-en")
    seed: int = 0
    num_utterances: int = 12000  # corpus size (utterances of distinct sentences)
    codebook_size: int = 1024
    device: str = "cpu"
    init_from: Path | None = None  # a shipped bundle whose target weights start training
    train_minutes: float | None = None  # stop the target's training after this long (resumable)
    max_steps: int = 3000
    decay_steps: int = 600
    draft_steps: int = 400
    workers: int = 2
    extra: dict = field(default_factory=dict)


def load_data(run_dir: Path) -> dict:
    return torch.load(run_dir / "data.pt", weights_only=False)


def stage_corpus(cfg: RecipeConfig) -> None:
    from recipes.demo.synth_corpus import synth_corpus
    from recipes.demo.text_corpus import ensure_text_packages

    ensure_text_packages()
    synth_corpus(cfg.run_dir / "corpus", cfg.num_utterances, cfg.seed, cfg.workers)


def stage_prepare(cfg: RecipeConfig) -> None:
    from recipes.demo.prepare import prepare

    if (cfg.run_dir / "data.pt").exists():
        print("[prepare] data.pt exists, kept")
        return
    prepare(cfg.run_dir, cfg.codebook_size, seed=cfg.seed)


def stage_train(cfg: RecipeConfig) -> None:
    from recipes.demo.train_lm import ModelSize, TrainConfig, train

    data = load_data(cfg.run_dir)
    init = cfg.init_from / "target" if cfg.init_from else None
    train(cfg.run_dir / "target", data["vocab"], data["train"], data["val"], ModelSize(),
          TrainConfig(seed=cfg.seed, max_steps=cfg.max_steps, decay_steps=cfg.decay_steps),
          init_from=init, device=cfg.device, time_budget_min=cfg.train_minutes)
