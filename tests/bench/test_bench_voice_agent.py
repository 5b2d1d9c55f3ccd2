"""pcgtts bench voice-agent's client against a real server: an answer streamed in LLM-sized pieces, its
first audio timed from the first sentence's final character, and a barge-in."""

from __future__ import annotations

import asyncio

import numpy as np
from pcgtts.bench.voice_agent import ANSWER, llm_pieces, longest_silence_s, one_answer


def test_pieces_are_llm_sized_and_keep_the_text():
    pieces = llm_pieces(ANSWER, seed=4)
    assert "".join(pieces) == ANSWER and {len(p) for p in pieces[:-1]} <= {1, 2, 3, 4, 5}


def test_longest_silence_counts_the_longest_quiet_run():
    pcm = np.concatenate([np.full(100, 500), np.zeros(2400), np.full(10, -300), np.zeros(24)]).astype("<i2")
    assert longest_silence_s(pcm.tobytes()) == 0.1


def test_one_answer_is_timed_and_a_barge_in_ends_it(live_server):
    row = asyncio.run(one_answer(live_server.url, seed=1, pace_s=0.0))
    assert not row["cancelled"] and row["audio_s"] > 3
    assert row["first_audio_after_first_sentence_s"] > 0 and row["stall_s"] >= 0
    assert 0.1 <= row["longest_silence_s"] <= 0.33  # the sentence pauses (0.12 s), under one codec block
    cut = asyncio.run(one_answer(live_server.url, seed=1, pace_s=1 / 30, cancel_after_s=0.2))
    assert cut["cancelled"] and cut["audio_s"] < row["audio_s"] and cut["cancel_to_done_s"] > 0
