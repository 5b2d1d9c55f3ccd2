"""The Llasa family (HKUST Llasa-1B/3B/8B): Llama-3 chat prompt, X-codec2 speech tokens <|s_i|>.

Token layout (Llama-3 tokenizer of 128,256 ids + 8 added specials + 65,536 speech tokens = 193,800):
  <|TEXT_UNDERSTANDING_START|> 128258, <|TEXT_UNDERSTANDING_END|> 128259,
  <|SPEECH_GENERATION_START|> 128260, <|SPEECH_GENERATION_END|> 128261 (the end token),
  <|s_i|> = 128264 + i for codec code i in [0, 65536).
Prompt (the model card's): user "Convert the text to speech:<|TEXT_UNDERSTANDING_START|>{prompt transcript}
{text}<|TEXT_UNDERSTANDING_END|>", assistant "<|SPEECH_GENERATION_START|>" + the voice's codes as <|s_i|>,
continued (no end-of-turn) so the model generates the target speech tokens.

Text is tokenised with the checkpoint's own tokenizer: through transformers' `apply_chat_template` when
transformers is installed (the exact template the checkpoint ships), else with the `tokenizers` library and
the plain Llama-3 chat layout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from pcgtts.engine.speech.base import DecodeConstraint, SpeechFamily, SpeechPrompt, VoicePrompt

TEXT_UNDERSTANDING_START = 128258
TEXT_UNDERSTANDING_END = 128259
SPEECH_GENERATION_START = 128260
SPEECH_GENERATION_END = 128261
SPEECH_OFFSET = 128264
NUM_CODES = 65536
VOCAB_SIZE = SPEECH_OFFSET + NUM_CODES  # 193,800

INSTRUCTION = "Convert the text to speech:"
LLAMA3_CHAT = ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n{assistant}")


class SpeechTokensOnly(DecodeConstraint):
    """Optional: only speech tokens and the end token may be generated (a text token would be dropped
    anyway). Depends on logits only, so it is trivially identical for draft and target."""

    def __init__(self, offset: int = SPEECH_OFFSET, num_codes: int = NUM_CODES,
                 end: int = SPEECH_GENERATION_END):
        self.offset, self.num_codes, self.end = offset, num_codes, end
        self.allowed_token_ids = [*range(offset, offset + num_codes), end]

    def apply(self, logits: torch.Tensor, histories) -> torch.Tensor:
        out = torch.full_like(logits, float("-inf"))
        keep = slice(self.offset, self.offset + self.num_codes)
        out[:, keep] = logits[:, keep]
        out[:, self.end] = logits[:, self.end]
        return out


class LlasaFamily(SpeechFamily):
    name = "llasa"
    tokenizer_in_target = True  # a bundle's Llasa tokenizer is the target checkpoint's

    def __init__(self, chat_ids: Callable[[str, str], list[int]], *, speech_only: bool = False):
        """chat_ids(user_content, assistant_prefix) -> token ids of the chat prompt, assistant turn open."""
        self.chat_ids = chat_ids
        self.constraint = SpeechTokensOnly() if speech_only else None

    @classmethod
    def from_dir(cls, root: str | Path, *, speech_only: bool = False,
                 use_transformers: bool | None = None) -> LlasaFamily:
        """The tokenizer files of a Llasa checkpoint directory (tokenizer.json [+ tokenizer_config.json])."""
        root = Path(root)
        if use_transformers is None:
            use_transformers = _has_transformers() and (root / "tokenizer_config.json").exists()
        chat_ids = _transformers_chat(root) if use_transformers else _tokenizers_chat(root)
        return cls(chat_ids, speech_only=speech_only)

    @property
    def stop_token_ids(self) -> list[int]:
        return [SPEECH_GENERATION_END]

    def speech_token_ids(self) -> list[int]:
        return [*range(SPEECH_OFFSET, SPEECH_OFFSET + NUM_CODES), SPEECH_GENERATION_END]

    def build_prompt(self, text: str, voice: VoicePrompt | None) -> SpeechPrompt:
        spoken = text
        codes: Sequence[int] = ()
        if voice is not None:
            transcript = voice.transcript.strip()
            spoken = f"{transcript} {text}" if transcript else text
            codes = voice.codes
        user = f"{INSTRUCTION}<|TEXT_UNDERSTANDING_START|>{spoken}<|TEXT_UNDERSTANDING_END|>"
        ids = self.chat_ids(user, "<|SPEECH_GENERATION_START|>")
        if ids[-1] != SPEECH_GENERATION_START:
            raise ValueError("the tokenizer does not have the Llasa special-token layout")
        return SpeechPrompt(token_ids=ids + self.codes_to_tokens(np.asarray(codes, dtype=np.int64)),
                            stop_token_ids=self.stop_token_ids, constraint=self.constraint)

    def tokens_to_codes(self, token_ids: Sequence[int]) -> np.ndarray:
        ids = np.asarray(token_ids, dtype=np.int64)
        return ids[(ids >= SPEECH_OFFSET) & (ids < SPEECH_OFFSET + NUM_CODES)] - SPEECH_OFFSET

    def codes_to_tokens(self, codes: np.ndarray) -> list[int]:
        codes = np.asarray(codes, dtype=np.int64)
        if codes.size and (codes.min() < 0 or codes.max() >= NUM_CODES):
            raise ValueError(f"X-codec2 codes lie in [0, {NUM_CODES})")
        return (codes + SPEECH_OFFSET).tolist()


def _has_transformers() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def _transformers_chat(root: Path) -> Callable[[str, str], list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(root))

    def chat_ids(user: str, assistant: str) -> list[int]:
        chat = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        out = tok.apply_chat_template(chat, tokenize=True, continue_final_message=True)
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return [int(i) for i in ids]

    return chat_ids


def _tokenizers_chat(root: Path) -> Callable[[str, str], list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    for name, expected in (("<|TEXT_UNDERSTANDING_START|>", TEXT_UNDERSTANDING_START),
                           ("<|SPEECH_GENERATION_END|>", SPEECH_GENERATION_END)):
        if tok.token_to_id(name) != expected:
            raise ValueError(f"{root}: {name} is not id {expected}; not a Llasa tokenizer")

    def chat_ids(user: str, assistant: str) -> list[int]:
        return tok.encode(LLAMA3_CHAT.format(user=user, assistant=assistant), add_special_tokens=False).ids

    return chat_ids
