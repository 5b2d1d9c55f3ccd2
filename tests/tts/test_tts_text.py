"""Where sentences end (tts/text.py), for whole inputs and for text arriving piece by piece, and the feed
that turns arriving text into segments (tts/feed.py)."""

from __future__ import annotations

import asyncio

import pytest
from pcgtts.bench.voice_agent import llm_pieces
from pcgtts.tts.feed import TextFeed
from pcgtts.tts.text import SentenceStream, sentences_of

ANSWERS = [
    "Dr. Smith paid $3.50 for 2 apples. Then he left! \"Why?\" she asked. Nobody knew.",
    "Sure! Here is the plan: first, we check the logs; then we restart it. It takes 2.5 minutes, i.e. "
    "about as long as a coffee. Mr. J. Doe agrees.",
    "The results:\n1. Apples are red.\n2. Pears are green\nThat is all... or is it? Yes. etc. and so on.",
    "Version 3. The best one yet. Call me at 5 p.m. Tomorrow works too.",
    "(It was late.) “Really?” Yes — really. The end",
]


@pytest.mark.parametrize(("text", "sentences"), [
    ("Dr. Smith paid $3.50 for 2 apples. Then he left.",
     ["Dr. Smith paid $3.50 for 2 apples.", "Then he left."]),  # abbreviation, decimal point, number
    ("He said \"Why?\" and left. She stayed!", ["He said \"Why?\" and left.", "She stayed!"]),
    ("We met J. Doe, e.g. at work. It was fine.", ["We met J. Doe, e.g. at work.", "It was fine."]),
    ("1. Apples. 2. Pears.", ["1. Apples.", "2. Pears."]),  # item numbers open their sentences
    ("Wait... what? In 1999. The year.", ["Wait... what?", "In 1999.", "The year."]),
    ("A line\nanother line. And more", ["A line", "another line.", "And more"]),
    ("  \n ", []),
])
def test_sentences_end_where_a_reader_ends_them(text, sentences):
    assert sentences_of(text) == sentences



@pytest.mark.parametrize("seed", range(20))
def test_text_arriving_in_pieces_is_cut_where_the_whole_text_is(seed):
    for i, text in enumerate(ANSWERS):
        stream, got = SentenceStream(), []
        for piece in llm_pieces(text, seed=100 * seed + i):
            got += stream.push(piece)
            assert got == sentences_of(text)[:len(got)]  # each as soon as complete, never revised
        got += stream.finish()
        assert got == sentences_of(text)


def test_a_sentence_is_complete_once_the_next_word_begins():
    stream = SentenceStream()
    assert stream.push("It costs 3.") == []  # "3.5" or the end of a sentence?
    assert stream.push(" ") == []  # "3. and" would go on
    assert stream.push("T") == ["It costs 3."]
    assert stream.pending == "T"


def test_waiting_words_are_cut_at_the_last_soft_break():
    stream = SentenceStream()
    stream.push("A long clause, with more words and a half-writ")
    assert stream.take_words() == "A long clause,"
    assert stream.take_words() == "with more words and a"
    assert stream.take_words() is None and stream.pending == "half-writ"  # no complete word left


def split_words(sentence: str) -> list[str]:
    return [sentence]


def test_feed_speaks_a_long_clause_at_its_character_bound():
    async def run():
        feed = TextFeed(split_words, max_pending_chars=30)
        made = [feed.push(p) for p in ["Sentence one. Now a clause that ", "goes on, and on ", "and on"]]
        got = [feed.push(" end."), feed.close()]
        return made + got, [s async for s in feed.segments()]

    made, segments = asyncio.run(run())
    assert segments == ["Sentence one.", "Now a clause that goes on,", "and on and on end."]
    assert made == [1, 1, 0, 0, 1]  # the bound passed with the second piece (34 characters pending)


def test_feed_speaks_pending_words_at_its_time_bound():
    async def run():
        feed = TextFeed(split_words, max_pending_s=0.05)
        feed.push("Words that wait for their full st")
        segments = feed.segments()
        first = await asyncio.wait_for(anext(segments), timeout=30)  # nothing more is pushed
        pending = feed.pending
        feed.push("op. ")
        feed.close()
        return first, pending, [s async for s in segments]

    first, pending, rest = asyncio.run(run())
    assert first == "Words that wait for their full" and pending == "st"
    assert rest == ["stop."]


def test_cancelled_feed_hands_out_nothing_more():
    async def run():
        feed = TextFeed(split_words)
        feed.push("One. Two. Thr")
        segments = feed.segments()
        first = await anext(segments)
        feed.cancel()
        return first, [s async for s in segments]

    assert asyncio.run(run()) == ("One.", [])
