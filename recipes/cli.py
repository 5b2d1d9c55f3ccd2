"""`pcgtts recipe demo`: rebuild the embedded demo model (see recipes/demo/pipeline.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pcgtts.recipes.demo.pipeline import STAGES, RecipeConfig, TrainPhase


def register(subparsers: argparse._SubParsersAction) -> None:
    recipe = subparsers.add_parser("recipe", help="rebuild shipped models from scratch")
    which = recipe.add_subparsers(dest="recipe", required=True)
    demo = which.add_parser("demo", help="the embedded demo model: corpus, codec, target, draft, ASG, voices")
    defaults = RecipeConfig()
    # no `choices`: Python 3.11's argparse rejects an empty nargs="*" list against them; run_demo checks
    demo.add_argument("stages", nargs="*", default=[],
                      help=f"stages to run, in order (default: all of {' '.join(STAGES)})")
    demo.add_argument("--run-dir", type=Path, default=defaults.run_dir, help="working files (git-ignored)")
    demo.add_argument("--model-dir", type=Path, default=defaults.model_dir,
                      help="where the bundle is written")
    demo.add_argument("--seed", type=int, default=defaults.seed)
    demo.add_argument("--num-utterances", type=int, default=defaults.num_utterances)
    demo.add_argument("--device", default=defaults.device, help="training device: cpu or cuda")
    demo.add_argument("--init-from", type=Path, default=None,
                      help="start the target from this bundle's weights (e.g. models/demo-en), not scratch")
    demo.add_argument("--train-minutes", type=float, default=None,
                      help="stop target training after this long (a later run resumes from the checkpoint)")
    demo.add_argument("--max-steps", type=int, default=None,
                      help="train the target in one cycle up to this step instead of the shipped schedule")
    demo.add_argument("--decay-steps", type=int, default=None, help="with --max-steps (default: 20%% of it)")
    demo.add_argument("--lr", type=float, default=None,
                      help=f"with --max-steps: peak learning rate (default {defaults.phases[-1].lr}); "
                           "a resumed run uses it from its next step")
    demo.add_argument("--speaker-warp", type=float, default=None,
                      help="with --max-steps: share of training examples turned into pseudo-speakers "
                           f"(default {defaults.phases[-1].speaker_warp}; recipes/demo/speaker_warp.py)")
    demo.add_argument("--draft-steps", type=int, default=defaults.draft_steps)
    demo.add_argument("--draft-shape", default=defaults.draft_shape,
                      help="draft LAYERSxHIDDEN[xHEADSxFFN] (default %(default)s; 'same': the target's "
                           "width, its first layer copied)")
    demo.add_argument("--draft-minutes", type=float, default=None,
                      help="time budget for the draft's distillation: the schedule shortens to fit "
                           "(resumable)")
    demo.add_argument("--draft-init", type=Path, default=None,
                      help="start the draft from this wider draft (e.g. models/demo-en/draft), projected to "
                           "--draft-shape's width and, where it gives HEADSxFFN, pruned to them, instead of "
                           "from the target")
    demo.add_argument("--draft-lr", type=float, default=defaults.draft_lr, help="draft peak learning rate")
    demo.add_argument("--head-steps", type=int, default=defaults.head_steps,
                      help="training steps of the feature-head draft (stage head)")
    demo.add_argument("--head-inner", type=int, default=defaults.head_inner, help="the head's FFN width")
    demo.add_argument("--head-minutes", type=float, default=None,
                      help="time budget for the head's training (resumable)")
    demo.add_argument("--self-distill-steps", type=int, default=defaults.sd_steps,
                      help="fine-tuning steps of the head on the target's own samples (stage self_distill)")
    demo.add_argument("--self-distill-minutes", type=float, default=defaults.sd_minutes,
                      help="time budget for stage self_distill's fine-tuning (resumable)")
    demo.add_argument("--threads", type=int, default=None, help="torch threads for training (default: all)")
    demo.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    from pcgtts.recipes.demo.pipeline import run

    unknown = [s for s in args.stages if s not in STAGES]
    if unknown:
        raise SystemExit(f"unknown stage(s) {unknown}; stages are {STAGES}")
    phases = RecipeConfig().phases
    if args.max_steps is not None:
        warp = phases[-1].speaker_warp if args.speaker_warp is None else args.speaker_warp
        phases = (TrainPhase(args.max_steps, args.decay_steps or args.max_steps // 5,
                             args.lr or phases[-1].lr, warp),)
    elif args.decay_steps is not None or args.lr is not None or args.speaker_warp is not None:
        raise SystemExit("--decay-steps, --lr and --speaker-warp go with --max-steps")
    cfg = RecipeConfig(run_dir=args.run_dir, model_dir=args.model_dir, seed=args.seed,
                       num_utterances=args.num_utterances, device=args.device, init_from=args.init_from,
                       train_minutes=args.train_minutes, phases=phases, draft_steps=args.draft_steps,
                       draft_shape=args.draft_shape, draft_minutes=args.draft_minutes,
                       draft_init=args.draft_init, draft_lr=args.draft_lr, head_steps=args.head_steps,
                       head_inner=args.head_inner, head_minutes=args.head_minutes, threads=args.threads,
                       sd_steps=args.self_distill_steps, sd_minutes=args.self_distill_minutes)
    run(cfg, args.stages or STAGES)
    return 0
