"""A synthesis of text that is still arriving (TTSService.text_feed): speaking starts before the text
ends, and the audio is the whole text's."""

from __future__ import annotations

import asyncio

import numpy as np
from pcgtts.bench.voice_agent import llm_pieces
from pcgtts.tts import NothingToSay, SynthesisOptions
from server_support import wait_idle

ANSWER = ("The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore, "
          "and Dr. Brown buys 2.5 of them. How much wood would a woodchuck chuck?")



async def _whole(service, text: str, seed: int) -> np.ndarray:
    synth = service.synthesize(text, None, SynthesisOptions(seed=seed))
    return np.concatenate([c async for c in synth])


def test_fed_text_speaks_its_first_sentence_before_the_rest_arrives(tts_service):
    first_end = ANSWER.index(". ") + 2
    tokens = llm_pieces(ANSWER[first_end + 1:], seed=3)

    async def run():
        feed = tts_service.text_feed()
        synth = tts_service.synthesize(feed, None, SynthesisOptions(seed=8))
        for piece in llm_pieces(ANSWER[:first_end + 1], seed=2):  # the first sentence and one letter more
            feed.push(piece)
        first = await asyncio.wait_for(synth.__anext__(), timeout=120)  # nothing else has been sent
        chunks = [first]
        sent_before_first_audio = feed.received_chars

        async def write_the_rest():
            for piece in tokens:
                feed.push(piece)
                await asyncio.sleep(0)
            feed.close()

        writer = asyncio.create_task(write_the_rest())
        chunks += [c async for c in synth]
        await writer
        return np.concatenate(chunks), synth.stats, sent_before_first_audio

    fed, stats, sent = asyncio.run(run())
    assert sent == first_end + 1 < len(ANSWER)
    segments = tts_service.segments(ANSWER)
    assert stats.sentences == len(segments) >= 3 and stats.finish_reason == "stop"
    whole = asyncio.run(_whole(tts_service, ANSWER, seed=8))
    assert fed.shape == whole.shape
    np.testing.assert_array_equal(fed, whole)  # same segments, same seeds per segment: the same audio
    wait_idle(tts_service)


def test_a_synthesis_waiting_for_text_holds_no_engine_work_and_cancels(tts_service):
    """Between sentences, while the rest of the text has not arrived, nothing runs in the engine; cancelling
    then (barge-in) ends the synthesis at once."""
    async def run():
        feed = tts_service.text_feed()
        synth = tts_service.synthesize(feed, None, SynthesisOptions(seed=1))
        feed.push("One short sentence. And a second that never ends")
        chunks: list[np.ndarray] = []

        async def listen():
            async for chunk in synth:
                chunks.append(chunk)

        listener = asyncio.create_task(listen())
        for _ in range(12_000):  # until the first sentence is spoken and the synthesis waits for text
            if feed.starved or listener.done():
                break
            await asyncio.sleep(0.01)
        waiting = feed.starved and not listener.done()
        await asyncio.to_thread(wait_idle, tts_service, 10)  # nothing left running in the engine
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
        await synth.aclose()
        return waiting, synth.stats

    waiting, stats = asyncio.run(run())
    assert waiting, "the synthesis never waited for the rest of the text"
    assert stats.generated_tokens > 0 and stats.audio_samples > 0 and stats.finish_reason == "stop"
    wait_idle(tts_service)


def test_a_feed_closed_without_words_says_nothing(tts_service):
    async def run():
        feed = tts_service.text_feed()
        synth = tts_service.synthesize(feed, None)
        feed.push(" ... ")
        feed.close()
        return [c async for c in synth]

    try:
        asyncio.run(run())
    except NothingToSay:
        return
    raise AssertionError("a feed without words gave audio")
