"""A Llasa-shaped checkpoint (193,800-token vocabulary, Llasa special-token layout) loads and generates."""

from __future__ import annotations

import numpy as np
import pytest
from engine_support import engine_config, save_draft_from, save_tiny_llama
from pcgtts.engine import Engine, SamplingParams
from pcgtts.engine.speech.base import VoicePrompt
from pcgtts.engine.speech.llasa import (
    NUM_CODES,
    SPEECH_GENERATION_END,
    SPEECH_GENERATION_START,
    SPEECH_OFFSET,
    TEXT_UNDERSTANDING_END,
    TEXT_UNDERSTANDING_START,
    VOCAB_SIZE,
    LlasaFamily,
)
from pcgtts.engine.speech.llasa_synthetic import LLAMA3_SPECIALS, save_llasa_tokenizer
from pcgtts.tts.bundle import ModelBundle


@pytest.fixture(scope="module")
def llasa_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("llasa") / "Llasa-tiny"
    save_tiny_llama(root, vocab=VOCAB_SIZE, hidden=32, heads=2, kv_heads=1, intermediate=64, layers=2,
                    tie=True, seed=51, init_std=0.2)
    save_llasa_tokenizer(root)
    return root


def test_prompt_layout_and_code_mapping(llasa_dir):
    voice = VoicePrompt(codes=np.array([0, 5, 65535]), transcript="hello")
    prompts = {}
    for use_transformers in (True, False):
        family = LlasaFamily.from_dir(llasa_dir, use_transformers=use_transformers)
        prompts[use_transformers] = family.build_prompt("hello world", voice)
    assert prompts[True].token_ids == prompts[False].token_ids  # chat template == plain Llama-3 layout
    ids = prompts[True].token_ids
    assert ids[0] == LLAMA3_SPECIALS["<|begin_of_text|>"]
    u0, u1 = ids.index(TEXT_UNDERSTANDING_START), ids.index(TEXT_UNDERSTANDING_END)
    assert ids[u0 + 1:u1] == [10, 10, 11]  # transcript, then the text
    assert ids[-4:] == [SPEECH_GENERATION_START, SPEECH_OFFSET, SPEECH_OFFSET + 5, SPEECH_OFFSET + 65535]
    assert prompts[True].stop_token_ids == [SPEECH_GENERATION_END]
    family = LlasaFamily.from_dir(llasa_dir)
    generated = [SPEECH_OFFSET + 7, 128009, SPEECH_OFFSET + 65535, SPEECH_GENERATION_END]
    assert family.tokens_to_codes(generated).tolist() == [7, 65535]
    assert family.codes_to_tokens(np.array([7, 65535])) == [SPEECH_OFFSET + 7, SPEECH_OFFSET + 65535]
    with pytest.raises(ValueError):
        family.codes_to_tokens(np.array([NUM_CODES]))
    assert isinstance(ModelBundle.from_dir(llasa_dir).load_family(), LlasaFamily)


def test_llasa_shaped_checkpoint_generates(llasa_dir, tmp_path):
    draft = save_draft_from(llasa_dir, tmp_path / "draft", layers=1)
    family = LlasaFamily.from_dir(llasa_dir, speech_only=True)
    prompt = family.build_prompt("hello world", VoicePrompt(codes=np.arange(20), transcript="hello"))
    params = SamplingParams(temperature=0.8, max_tokens=12, seed=3, stop_token_ids=prompt.stop_token_ids,
                            constraint=prompt.constraint)
    engine = Engine(engine_config(llasa_dir, draft=draft, num_speculative_tokens=3))
    assert engine.vocab_size == VOCAB_SIZE
    out = engine.generate([prompt.token_ids], params)[0]
    assert 1 <= len(out.token_ids) <= 12
    speech = [t for t in out.token_ids if t != SPEECH_GENERATION_END]
    assert all(SPEECH_OFFSET <= t < VOCAB_SIZE for t in speech)  # the constraint kept text tokens out
    assert len(family.tokens_to_codes(out.token_ids)) == len(speech)

    greedy = SamplingParams(temperature=0, max_tokens=10, stop_token_ids=prompt.stop_token_ids)
    target_only = Engine(engine_config(llasa_dir))
    assert engine.generate([prompt.token_ids], greedy)[0].token_ids == \
        target_only.generate([prompt.token_ids], greedy)[0].token_ids
