"""The demo-model recipe as stages; `pcgtts recipe demo` runs them in order, each resumable.

Stages: corpus -> prepare (codebook, codes, vocabulary) -> train (target LM) -> decoder (codec conv
decoder) -> durations (duration model) -> draft (distilled 1-layer Llama draft: the peers' benchmarks' and
`--draft` alternative) -> head (the feature-head draft the bundle speculates with) -> voices (preset voices)
-> bundle (export) -> self_distill (the head fine-tuned on the target's own samples, replacing the bundle's)
-> tables (ASG tables into the bundle and its manifest) -> eval. Working files live in
the run directory (git-ignored); the bundle is written to the model directory.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

# The shipped default sampling: this small model is far more intelligible below the OpenAI-style
# default of 1.0 (models/demo-en/EVAL.md: WER by temperature) and still ends every utterance by itself.
SAMPLING_DEFAULTS = {"temperature": 0.5}
# each phoneme ends within ±this fraction of its predicted duration. Chosen by WER on 40 development
# sentences (T=0.8, seeds 0/1): the LM's own timing within p95 caps 1.02; a smaller duration model (d=64,
# 1,500 steps) exactly 0.79, within ±20% 0.91; the shipped one exactly 0.705; espeak-ng's own durations 0.69
DURATION_WINDOW = 0.0
STAGES = ["corpus", "prepare", "train", "decoder", "durations", "draft", "head", "voices", "bundle",
          "self_distill", "tables", "eval"]


@dataclass(frozen=True)
class TrainPhase:
    """One warmup-stable-decay cycle of the target's training, up to step `max_steps`."""

    max_steps: int
    decay_steps: int
    lr: float
    speaker_warp: float = 0.0  # share of examples turned into pseudo-speakers (recipes/demo/speaker_warp.py)


# The shipped target's schedule (models/demo-en/README.md): five cycles, each resuming the checkpoint of
# the one before and re-raising the learning rate; the last two turn half the examples into pseudo-speakers.
# Batches are a function of the step, so a rerun sees the same data in the same order.
SHIPPED_PHASES = (TrainPhase(1500, 450, 1.5e-3), TrainPhase(4600, 900, 1.5e-3), TrainPhase(6300, 600, 8e-4),
                  TrainPhase(7200, 300, 6e-4, speaker_warp=0.5),
                  TrainPhase(8100, 300, 6e-4, speaker_warp=0.5))


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
    phases: tuple[TrainPhase, ...] = SHIPPED_PHASES  # batches of 12 utterances
    draft_steps: int = 2400
    draft_shape: str = "1x128"  # recipes/demo/train_draft.py DraftShape.parse: "same" = the target's width
    draft_minutes: float | None = None  # time budget for the draft's distillation (resumable)
    draft_init: Path | None = None  # a wider draft of the same target to project and fine-tune from
    draft_lr: float = 6e-3
    head_steps: int = 2000  # the feature head's training (recipes/demo/train_draft_head.py)
    head_inner: int = 384  # FFN width: 1,024 accepts ~3% more per step but costs 1.6x per draft step
    head_minutes: float | None = None
    # the head's fine-tuning on the target's own samples (stage self_distill, recipes/demo/self_distill.py)
    sd_sequences: int = 3104  # generated sequences trained on (another 96 held out)
    sd_steps: int = 1500
    sd_lr: float = 1e-3
    sd_minutes: float | None = 20
    duration_steps: int = 2500
    workers: int = 2
    threads: int | None = None  # torch threads for training (1 beats 2 on a shared 2-core box)
    extra: dict = field(default_factory=dict)


def load_data(run_dir: Path) -> dict:
    return torch.load(run_dir / "data.pt", weights_only=False)


def stage_corpus(cfg: RecipeConfig) -> None:
    from pcgtts.recipes.demo.synth_corpus import synth_corpus
    from pcgtts.recipes.demo.text_corpus import ensure_text_packages

    ensure_text_packages()
    synth_corpus(cfg.run_dir / "corpus", cfg.num_utterances, cfg.seed, cfg.workers)


def stage_prepare(cfg: RecipeConfig) -> None:
    from pcgtts.recipes.demo.prepare import prepare

    if (cfg.run_dir / "data.pt").exists():
        print("[prepare] data.pt exists, kept")
        return
    prepare(cfg.run_dir, cfg.codebook_size, seed=cfg.seed, init_from=cfg.init_from)


def stage_train(cfg: RecipeConfig) -> None:
    from pcgtts.recipes.demo.train_lm import ModelSize, TrainConfig, train

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    data = load_data(cfg.run_dir)
    init = cfg.init_from / "target" if cfg.init_from else None
    code_maps = None
    if any(phase.speaker_warp for phase in cfg.phases):
        from pcgtts.engine.codec.demo.codec import DemoMelCodec
        from pcgtts.recipes.demo.speaker_warp import warp_code_maps

        code_maps = warp_code_maps(DemoMelCodec.from_dir(cfg.run_dir / "codec"))
    deadline = None if cfg.train_minutes is None else time.time() + 60 * cfg.train_minutes
    for phase in cfg.phases:
        budget = None if deadline is None else max(0.0, (deadline - time.time()) / 60)
        step = train(cfg.run_dir / "target", data["vocab"], data["train"], data["val"], ModelSize(),
                     TrainConfig(seed=cfg.seed, max_steps=phase.max_steps, decay_steps=phase.decay_steps,
                                 lr=phase.lr, speaker_warp=phase.speaker_warp),
                     init_from=init, device=cfg.device, time_budget_min=budget, code_maps=code_maps)
        if step < phase.max_steps:  # stopped early (time budget, SIGTERM): a later run resumes this phase
            print(f"[train] stopped at step {step} of phase {phase}", flush=True)
            return


def stage_decoder(cfg: RecipeConfig) -> None:
    """Fit the conv decoder; keep it only if it measures better (Whisper WER) than the centroid lookup."""
    import json

    from pcgtts.engine.codec.demo.codec import DemoMelCodec
    from pcgtts.recipes.demo.eval_codec import roundtrip_wer
    from pcgtts.recipes.demo.synth_corpus import load_corpus
    from pcgtts.recipes.demo.train_decoder import DECODER_KWARGS, decoder_l1, train_decoder

    out = cfg.run_dir / "codec_final"
    if (out / "codec.json").exists():
        print("[decoder] codec_final exists, kept")
        return
    base = DemoMelCodec.from_dir(cfg.run_dir / "codec")
    data, corpus = load_data(cfg.run_dir), load_corpus(cfg.run_dir / "corpus")
    codes, mels = data["train"].codes, corpus["mel"]
    net = train_decoder(base.codebook, codes[:-200], mels[:-200], seed=cfg.seed)
    net_l1 = decoder_l1(net, codes[-200:], mels[-200:])
    conv = DemoMelCodec(base.codebook, net, base.gl)

    systems = {"mel_griffin_lim": lambda a: base.synthesize(base.features(a)),
               "codec_centroid": lambda a: base.decode(base.encode(a)),
               "codec_conv": lambda a: conv.decode(conv.encode(a))}
    report = roundtrip_wer(systems, count=30, seed=cfg.seed)
    report["l1"] = {"centroid": decoder_l1(base.decoder, codes[-200:], mels[-200:]), "conv": net_l1}
    print(f"[decoder] {json.dumps({k: v for k, v in report.items() if k != '_examples'})}", flush=True)
    chosen = conv if report["codec_conv"]["wer"] <= report["codec_centroid"]["wer"] else base
    report["chosen"] = "conv" if chosen is conv else "centroid"
    chosen.save(out, DECODER_KWARGS)
    (cfg.run_dir / "codec_eval.json").write_text(json.dumps(report, indent=1))


def stage_durations(cfg: RecipeConfig) -> None:
    """The duration model (engine/speech/demo/durations.py) from the corpus's phoneme alignments."""
    from pcgtts.recipes.demo.train_durations import train_durations

    out = cfg.run_dir / "duration"
    if (out / "model.safetensors").exists():
        print("[durations] model exists, kept")
        return
    data = load_data(cfg.run_dir)
    train_durations(data["train"], data["val"], data["vocab"].codebook_size, out, steps=cfg.duration_steps,
                    seed=cfg.seed)


def export_target(cfg: RecipeConfig) -> Path:
    """The run's export directory, holding the target the drafts learn from: the trained checkpoint's export,
    or (a new draft for a shipped target) the `--init-from` bundle's weights."""
    from pcgtts.recipes.demo.train_lm import export

    export_dir = cfg.run_dir / "export"
    if (cfg.run_dir / "target" / "ckpt.pt").exists():
        export(cfg.run_dir / "target" / "ckpt.pt", export_dir / "target")
    elif cfg.init_from is not None:
        import shutil

        shutil.copytree(cfg.init_from / "target", export_dir / "target", dirs_exist_ok=True)
    return export_dir


def draft_training_inputs(cfg: RecipeConfig, exported: str):
    """(export dir, data, target in float32) for a stage that trains a draft exported as export/`exported`;
    None when that export exists already (the stage is done and keeps it)."""
    from transformers import LlamaForCausalLM

    export_dir = export_target(cfg)
    if (export_dir / exported / "config.json").exists():
        print(f"[{exported}] exported {exported} exists, kept")
        return None
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    data = load_data(cfg.run_dir)
    return export_dir, data, LlamaForCausalLM.from_pretrained(export_dir / "target", dtype=torch.float32)


def stage_draft(cfg: RecipeConfig) -> None:
    """Export the target checkpoint (fp16 Hugging Face dir) and distil the draft from it."""
    from pcgtts.recipes.demo.train_draft import DraftShape, distill, held_out_acceptance
    from transformers import LlamaForCausalLM

    inputs = draft_training_inputs(cfg, "draft")
    if inputs is None:
        return
    export_dir, data, target = inputs
    init = LlamaForCausalLM.from_pretrained(cfg.draft_init, dtype=torch.float32) if cfg.draft_init else None
    draft = distill(target, data["vocab"], data["train"], cfg.run_dir / "draft", steps=cfg.draft_steps,
                    shape=DraftShape.parse(cfg.draft_shape), lr=cfg.draft_lr, seed=cfg.seed + 1,
                    time_budget_min=cfg.draft_minutes, init_from=init)
    alpha = held_out_acceptance(target, draft, data["vocab"], data["val"])
    print(f"[draft] held-out per-token acceptance (exact, T=0.8, teacher-forced): {alpha:.3f}", flush=True)
    (cfg.run_dir / "draft" / "acceptance.json").write_text(json.dumps({"held_out_per_token_alpha": alpha}))
    draft.to(torch.float16).save_pretrained(export_dir / "draft", safe_serialization=True)


def stage_head(cfg: RecipeConfig) -> None:
    """Train the feature-head draft on the target's hidden states."""
    from pcgtts.recipes.demo.train_draft_head import export_head, held_out_acceptance_by_step, train_head

    inputs = draft_training_inputs(cfg, "draft-head")
    if inputs is None:
        return
    export_dir, data, target = inputs
    head = train_head(target, data["vocab"], data["train"], cfg.run_dir / "head", inner=cfg.head_inner,
                      steps=cfg.head_steps, seed=cfg.seed + 11, time_budget_min=cfg.head_minutes)
    alphas = held_out_acceptance_by_step(target, head, data["vocab"], data["val"])
    print(f"[head] held-out acceptance by draft step (exact, T=0.8, teacher-forced): "
          f"{', '.join(f'{a:.3f}' for a in alphas)}", flush=True)
    (cfg.run_dir / "head" / "acceptance.json").write_text(json.dumps({"held_out_alpha_by_step": alphas}))
    export_head(head, export_dir / "draft-head")


def stage_self_distill(cfg: RecipeConfig) -> None:
    """Fine-tune the bundle's feature head on the target's own samples; replaces model_dir/draft-head."""
    from pcgtts.recipes.demo.self_distill import (
        HELD_OUT_SEQUENCES,
        generate_sequences,
        held_out_alpha_by_step,
        sequence_batches,
    )
    from pcgtts.recipes.demo.train_draft_head import export_head, load_head, train_head
    from transformers import LlamaForCausalLM

    out, head_dir = cfg.run_dir / "self-distill", cfg.model_dir / "draft-head"
    if (out / "acceptance.json").exists():
        print("[self_distill] done before (its acceptance.json exists), kept")
        return
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rows = generate_sequences(cfg.model_dir, cfg.sd_sequences + HELD_OUT_SEQUENCES, out / "sequences.jsonl",
                              seed=cfg.seed)
    train, held = rows[:-HELD_OUT_SEQUENCES], rows[-HELD_OUT_SEQUENCES:]
    target = LlamaForCausalLM.from_pretrained(cfg.model_dir / "target", dtype=torch.float32)
    before = held_out_alpha_by_step(target, load_head(head_dir, target), held)
    head = train_head(target, None, None, out / "head", steps=cfg.sd_steps, lr=cfg.sd_lr,
                      seed=cfg.seed + 13, time_budget_min=cfg.sd_minutes, init=head_dir,
                      batches=sequence_batches(train, 12, cfg.seed + 13))
    after = held_out_alpha_by_step(target, head, held)
    print(f"[self_distill] held-out acceptance by draft step on the target's samples (T=0.8): "
          f"{', '.join(f'{a:.3f}' for a in before)} -> {', '.join(f'{a:.3f}' for a in after)}", flush=True)
    export_head(head, head_dir)
    (out / "acceptance.json").write_text(json.dumps({"before": before, "after": after}))


def stage_voices(cfg: RecipeConfig) -> None:
    from pcgtts.engine.codec.demo.codec import DemoMelCodec
    from pcgtts.recipes.demo.voices import make_presets

    make_presets(DemoMelCodec.from_dir(cfg.run_dir / "codec_final"), cfg.model_dir / "voices", cfg.seed)


def stage_bundle(cfg: RecipeConfig) -> None:
    """Assemble the model directory: target, draft, codec, vocabulary, manifest, loss curves."""
    import json
    import shutil

    from pcgtts.recipes.demo.durations import duration_caps
    from pcgtts.recipes.demo.report import plot_losses

    model_dir, export_dir = cfg.model_dir, cfg.run_dir / "export"
    model_dir.mkdir(parents=True, exist_ok=True)
    for name, src in (("target", export_dir / "target"), ("draft", export_dir / "draft"),
                      ("draft-head", export_dir / "draft-head"),
                      ("codec", cfg.run_dir / "codec_final"), ("duration", cfg.run_dir / "duration")):
        shutil.rmtree(model_dir / name, ignore_errors=True)
        shutil.copytree(src, model_dir / name, ignore=shutil.ignore_patterns("generation_config.json",
                                                                            "train.json"))
    data = load_data(cfg.run_dir)
    vocab = data["vocab"]
    vocab.save(model_dir / "family.json")
    family = json.loads((model_dir / "family.json").read_text())
    voices = sorted(p.stem for p in (model_dir / "voices").glob("*.json"))
    family["default_voice"] = voices[0] if voices else None
    family["max_phoneme_frames"] = duration_caps(vocab, data["train"])  # used without a duration model
    family["duration_window"] = DURATION_WINDOW
    (model_dir / "family.json").write_text(json.dumps(family, indent=1))
    manifest = {"family": "demo-phoneme", "target": "target", "draft": "draft-head", "codec": "codec",
                "codec_type": "demo-mel", "voices": "voices", "sampling": SAMPLING_DEFAULTS}
    (model_dir / "pcgtts.json").write_text(json.dumps(manifest, indent=1))
    plot_losses(cfg.run_dir, model_dir / "loss_curves.png")


def stage_tables(cfg: RecipeConfig) -> None:
    """(Re)build the bundle's ASG tables from its target and codec; needs only the model directory."""
    from pcgtts.engine.speech.demo.layout import DemoVocab
    from pcgtts.recipes.demo.asg import build_table

    model_dir = cfg.model_dir
    for old in model_dir.glob("asg-*.safetensors"):
        old.unlink()
    tables = build_table(model_dir, DemoVocab.load(model_dir / "family.json"))
    manifest = json.loads((model_dir / "pcgtts.json").read_text())
    manifest |= {"asg_table": "asg.safetensors", "extra_asg_tables": tables["extra_tables"]}
    (model_dir / "pcgtts.json").write_text(json.dumps(manifest, indent=1))


def stage_eval(cfg: RecipeConfig) -> None:
    import json

    from pcgtts.recipes.demo.eval_lm import evaluate
    from pcgtts.recipes.demo.report import write_report

    report = evaluate(cfg.model_dir, seed=cfg.seed, **cfg.extra.get("eval", {}))
    (cfg.model_dir / "eval.json").write_text(json.dumps(report, indent=1))
    write_report(cfg.run_dir, cfg.model_dir, report)


def run(cfg: RecipeConfig, stages: list[str]) -> None:
    funcs = {name: globals()[f"stage_{name}"] for name in STAGES}
    for name in stages:
        print(f"[recipe] stage {name}", flush=True)
        funcs[name](cfg)
