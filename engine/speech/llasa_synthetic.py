"""A stand-in for a Llasa checkpoint's tokenizer, for random Llasa-shaped models (tests, GPU dry runs).

Word-level over 128,256 ids (a few real words, the Llama-3 specials at their ids, the rest placeholders),
then the 8 Llasa special tokens at their real ids, so prompts have Llasa's exact layout (engine.speech.llasa).
"""

from __future__ import annotations

from pathlib import Path

LLAMA3_SPECIALS = {"<|begin_of_text|>": 128000, "<|start_header_id|>": 128006, "<|end_header_id|>": 128007,
                   "<|eot_id|>": 128009}
LLASA_SPECIALS = ["<|TEXT_GENERATION_START|>", "<|TEXT_GENERATION_END|>", "<|TEXT_UNDERSTANDING_START|>",
                  "<|TEXT_UNDERSTANDING_END|>", "<|SPEECH_GENERATION_START|>", "<|SPEECH_GENERATION_END|>",
                  "<|SPEECH_UNDERSTANDING_START|>", "<|SPEECH_UNDERSTANDING_END|>"]
CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
                 "<|end_header_id|>\n\n{{ message['content'] }}<|eot_id|>{% endfor %}")


def save_llasa_tokenizer(path: Path) -> None:
    """A word-level stand-in for the Llama-3 tokenizer with Llasa's special-token ids (128,256 base ids,
    then the 8 Llasa specials), saved as tokenizer.json and as a transformers tokenizer with a template."""
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    words = {"Convert": 5, "the": 6, "text": 7, "to": 8, "speech:": 9, "hello": 10, "world": 11}
    names = {i: f"w{i}" for i in range(128000)} | {128000 + i: f"<|reserved_{i}|>" for i in range(256)}
    names |= {i: w for w, i in (words | LLAMA3_SPECIALS).items()}
    vocab = {name: i for i, name in names.items()}  # 128,256 ids, so added tokens start at 128,256
    tok = Tokenizer(WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True) for t in [*LLAMA3_SPECIALS, *LLASA_SPECIALS]])
    path.mkdir(parents=True, exist_ok=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                                   eos_token="<|eot_id|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
