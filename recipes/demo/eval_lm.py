"""Offline evaluation of the demo bundle (held-out sentences): the issue's quality gates, measured.

* target-only: Whisper tiny.en WER, share of utterances that end by themselves (<end>), duration vs
  espeak-ng's for the same text and voice; several seeds at one temperature, and once each with the LM
  deciding when phonemes end (within the corpus's duration caps, and with no bounds at all);
* voice cloning: held-out speakers' clips as prompts; resemblyzer similarity to that speaker vs to every
  preset voice (speaker embeddings from several clips, through the codec like the generated audio);
* draft alone (WER), exact speculative decoding at γ=3 (acceptance rate α) and the draft/target per-token
  cost ratio.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from pcgtts.engine import Engine, EngineConfig, SamplingParams
from pcgtts.engine.codec.demo.features import HOP
from pcgtts.engine.speech.base import VoicePrompt
from pcgtts.engine.speech.demo.layout import MAX_REF_FRAMES
from pcgtts.recipes.demo.eval_codec import eval_sentences
from pcgtts.recipes.demo.eval_tools import SpeakerEncoder, Transcriber, corpus_wer
from pcgtts.recipes.demo.speakers import split_speakers
from pcgtts.recipes.demo.synth_corpus import render
from pcgtts.recipes.demo.voices import preset_speakers, reference_clip
from pcgtts.tts.bundle import ModelBundle

MAX_TOKENS = 700  # ~10 s of speech plus markers: far beyond any eval sentence


@dataclass
class Item:
    text: str
    voice: VoicePrompt
    espeak_seconds: float
    speaker: str


def _engine(bundle: ModelBundle, *, draft: bool, target_dir: Path | None = None,
            num_speculative_tokens: int = 3) -> Engine:
    return Engine(EngineConfig(target=str(target_dir or bundle.target_dir),
                               draft=str(bundle.draft_dir) if draft else None,
                               acceptance="exact",
                               num_speculative_tokens=num_speculative_tokens if draft else 0))


def _generate(engine: Engine, family, items: list[Item], temperature: float, seed: int,
              timing: str = "bundle"):
    """timing: who decides when each phoneme ends. "bundle": as shipped (the duration model's windows);
    "caps": the LM, within the corpus's per-phoneme caps; "free": the LM alone (no duration bounds)."""
    prompts = [family.build_prompt(it.text, it.voice) for it in items]
    if timing == "caps":
        prompts = [replace(p, constraint=family.constraint(family.phoneme_ids(it.text), it.voice,
                                                           durations=False))
                   for p, it in zip(prompts, items, strict=True)]
    elif timing == "free":
        prompts = [replace(p, constraint=p.constraint.without_caps()) for p in prompts]
    params = [SamplingParams(temperature=temperature, max_tokens=MAX_TOKENS, stop_token_ids=p.stop_token_ids,
                             seed=seed * 100003 + i, constraint=p.constraint) for i, p in enumerate(prompts)]
    start = time.time()
    gens = engine.generate([p.token_ids for p in prompts], params)
    return gens, time.time() - start


def target_items(family, codec, count: int, seed: int = 0) -> list[Item]:
    """Held-out sentences, each spoken by a preset voice in turn (espeak duration with that speaker)."""
    presets = preset_speakers(seed)
    names = sorted(family.voices)
    items = []
    for k, (text, _) in enumerate(eval_sentences(count, seed)):
        name = names[k % len(names)]
        audio, _, _ = render(text, presets[name])
        items.append(Item(text, family.voices[name], len(audio) / codec.sample_rate, name))
    return items


def score(gens, items: list[Item], family, codec, transcriber: Transcriber) -> dict:
    refs, hyps, ratios, ended = [], [], [], []
    for g, it in zip(gens, items, strict=True):
        audio = codec.decode(family.tokens_to_codes(g.token_ids))
        refs.append(it.text)
        hyps.append(transcriber(audio) if len(audio) > HOP else "")
        ratios.append(len(audio) / codec.sample_rate / it.espeak_seconds)
        ended.append(g.finish_reason == "stop")
    ratios = np.array(ratios)
    return {"wer": corpus_wer(refs, hyps), "ended_share": float(np.mean(ended)),
            "duration_ratio_median": float(np.median(ratios)),
            "duration_within_30pct": float(np.mean(np.abs(ratios - 1) <= 0.3)), "n": len(items),
            "examples": [{"ref": r, "hyp": h} for r, h in list(zip(refs, hyps, strict=True))[:4]]}


SPEAKER_CLIPS = 5  # clips per speaker embedding


def cloning(bundle, family, codec, speaker_encoder, per_speaker: int, temperature: float,
            seeds: tuple[int, ...], seed: int = 0, speakers: str = "held_out") -> dict:
    """Prompt with a speaker's clip; is the output closer to that speaker than to every preset voice?

    Each speaker (prompted and preset) is one embedding, from SPEAKER_CLIPS of its utterances passed
    through the codec as the generated audio is, so the comparison is between voices, not between the
    codec's sound and espeak-ng's. Ceilings: the speakers' own renderings of the same texts, as they are
    and through the codec, in the same test. speakers: "held_out" (never trained on: the gate) or
    "held_in" (eight trained-on speakers that are not presets: what the model does with voices it knows).
    """
    held_in, held_out = split_speakers(seed)
    presets = preset_speakers(seed)
    if speakers == "held_in":
        preset_keys = {v.key for v in presets.values()}
        others = [v for v in held_in if v.key not in preset_keys]
        prompted = [others[k] for k in np.random.default_rng(seed).choice(len(others), 8, replace=False)]
    else:
        prompted = held_out
    sentences = [t for t, _ in eval_sentences(80, seed)]
    gen_texts, clip_texts, speaker_texts = sentences[:40], sentences[40:60], sentences[60:60 + SPEAKER_CLIPS]

    def embeddings(voice) -> dict[bool, np.ndarray]:
        """through_codec -> the speaker's embedding"""
        clips = [render(t, voice)[0] for t in speaker_texts]
        return {False: speaker_encoder.speaker(clips),
                True: speaker_encoder.speaker([codec.decode(codec.encode(c)) for c in clips])}

    preset_emb = [embeddings(v) for v in presets.values()]
    own_emb = [embeddings(v) for v in prompted]

    def margins(audio: np.ndarray, s: int) -> dict[bool, float]:
        """through_codec -> similarity to speaker s minus that to the closest preset"""
        emb = speaker_encoder(audio)
        return {k: float(emb @ own_emb[s][k]) - max(float(emb @ e[k]) for e in preset_emb)
                for k in (True, False)}

    items = []
    for s, voice in enumerate(prompted):
        clip, text = reference_clip(voice, clip_texts)
        prompt = VoicePrompt(codes=codec.encode(clip)[:MAX_REF_FRAMES], transcript=text)
        items += [(s, Item(gen_texts[(s * per_speaker + k) % len(gen_texts)], prompt, 0.0, voice.key))
                  for k in range(per_speaker)]
    engine = _engine(bundle, draft=False)
    generated = []  # margins of every clone, seed by seed
    for sd in seeds:
        gens, _ = _generate(engine, family, [it for _, it in items], temperature, sd)
        generated += [margins(codec.decode(family.tokens_to_codes(g.token_ids)), s)
                      for g, (s, _) in zip(gens, items, strict=True)]
    real = [(render(it.text, prompted[s])[0], s) for s, it in items]
    originals = [margins(a, s) for a, s in real]
    round_trips = [margins(codec.decode(codec.encode(a)), s) for a, s in real]
    ceiling = {"original": float(np.mean([m[False] > 0 for m in originals])),
               "codec_round_trip": float(np.mean([m[True] > 0 for m in round_trips])),
               "codec_round_trip_vs_real_audio": float(np.mean([m[False] > 0 for m in round_trips]))}
    margin = np.array([m[True] for m in generated])
    wins = margin.reshape(len(seeds), len(prompted), per_speaker) > 0
    return {"win_share": float(wins.mean()), "win_share_per_seed": wins.mean(axis=(1, 2)).tolist(),
            "win_share_vs_real_audio": float(np.mean([m[False] > 0 for m in generated])),
            "margin_median": float(np.median(margin)), "n": int(wins.size), "seeds": list(seeds),
            "speakers": speakers, "prompted_speakers": [v.key for v in prompted],
            "wins_per_speaker": wins.sum(axis=(0, 2)).tolist(),
            "wins": wins.astype(int).tolist(),  # [seed][speaker][prompt], for paired comparisons
            "ceiling_win_share": ceiling}


def per_token_cost(bundle: ModelBundle, family, items: list[Item], tokens: int = 120) -> dict:
    """Seconds per generated token of one sequence, target alone vs draft alone (same engine code)."""
    out = {}
    for name, target in (("target", bundle.target_dir), ("draft", bundle.draft_dir)):
        engine = Engine(EngineConfig(target=str(target)))
        prompt = family.build_prompt(items[0].text, items[0].voice)
        params = SamplingParams(temperature=0.8, max_tokens=tokens, seed=0)  # unconstrained: fixed length
        engine.generate([prompt.token_ids], params)  # warm-up
        times = []
        for _ in range(3):
            start = time.time()
            g = engine.generate([prompt.token_ids], params)[0]
            times.append((time.time() - start) / len(g.token_ids))
        out[name] = float(np.median(times))
    out["ratio"] = out["draft"] / out["target"]
    return out


def evaluate(model_dir: Path, *, count: int = 20, seeds: tuple[int, ...] = (0, 1, 2),
             temperature: float = 0.8, extra_temperatures: tuple[float, ...] = (0.5, 0.6),
             clone_per_speaker: int = 5, seed: int = 0) -> dict:
    bundle = ModelBundle.from_dir(model_dir)
    family, codec = bundle.load_family(), bundle.load_codec()
    transcriber = Transcriber()
    items = target_items(family, codec, count, seed)
    report: dict = {"temperature": temperature, "seeds": list(seeds), "count": count}
    started = time.time()
    target_engine = _engine(bundle, draft=False)
    runs = []
    for s in seeds:
        gens, secs = _generate(target_engine, family, items, temperature, s)
        runs.append(score(gens, items, family, codec, transcriber) | {"seed": s, "generate_seconds": secs})
        print(f"[eval] target seed {s}: WER {runs[-1]['wer']:.3f} ended {runs[-1]['ended_share']:.2f}",
              flush=True)
    report["target"] = runs
    for timing in ("caps", "free"):  # what the duration model does: the LM's own timing, capped and not
        gens, secs = _generate(target_engine, family, items, temperature, seeds[0], timing=timing)
        scores = score(gens, items, family, codec, transcriber)
        report[f"target_timing_{timing}"] = scores | {"seed": seeds[0]}
    for t in extra_temperatures:  # intelligibility rises as temperature falls: one seed at each
        gens, secs = _generate(target_engine, family, items, t, seeds[0])
        report.setdefault("target_other_temperatures", []).append(
            score(gens, items, family, codec, transcriber) | {"temperature": t, "seed": seeds[0]})
    if bundle.draft_dir is not None:
        gens, secs = _generate(_engine(bundle, draft=False, target_dir=bundle.draft_dir), family, items,
                               temperature, seeds[0])
        report["draft_alone"] = score(gens, items, family, codec, transcriber) | {"generate_seconds": secs}
        spec_engine = _engine(bundle, draft=True, num_speculative_tokens=3)
        gens, secs = _generate(spec_engine, family, items, temperature, seeds[0])
        drafted = sum(g.num_drafted for g in gens)
        accepted = sum(g.num_accepted for g in gens)
        steps = sum(g.num_steps for g in gens)  # verify steps; each emits its accepted drafts + 1 token
        report["speculative_exact_gamma3"] = score(gens, items, family, codec, transcriber) | {
            "alpha": accepted / max(1, drafted), "drafted": drafted, "accepted": accepted, "steps": steps,
            "tokens_per_verify_step": 1 + accepted / max(1, steps),
            "generate_seconds": secs, "target_only_seconds": runs[0]["generate_seconds"]}
        print(f"[eval] exact γ=3 α {accepted / max(1, drafted):.3f}", flush=True)
        report["cost_per_token"] = per_token_cost(bundle, family, items)
    speaker_encoder = SpeakerEncoder()
    report["cloning"] = cloning(bundle, family, codec, speaker_encoder, clone_per_speaker, temperature, seeds,
                                seed)
    report["cloning_seen_speakers"] = cloning(bundle, family, codec, speaker_encoder, clone_per_speaker,
                                              temperature, seeds[:1], seed, speakers="held_in")
    print(f"[eval] cloning win share {report['cloning']['win_share']:.2f} (trained-on speakers "
          f"{report['cloning_seen_speakers']['win_share']:.2f})", flush=True)
    report["eval_seconds"] = time.time() - started
    return report
