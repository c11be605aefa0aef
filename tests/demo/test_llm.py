"""The pluggable language model: the offline default's deterministic outputs."""

from __future__ import annotations

import time

import pytest

from rota_demo.brief import Brief
from rota_demo.llm import (
    Completion,
    LanguageModel,
    OfflineModel,
    ScoreParseError,
    count_tokens,
    draft_message,
    parse_score,
    rationale,
    score,
    summarize_comments,
)
from rota_demo.youtube import Channel, Comment

BRIEF = Brief(
    url="https://stridewell.example/",
    brand="Stridewell",
    summary="Stridewell makes lightweight trail running shoes. Tested on ultramarathon courses.",
    keywords=["running shoes", "trail running", "ultramarathon", "grippy"],
    search_queries=["running shoes"],
)
RUN = Channel(
    id="UCrun",
    title="Pace Notes TV",
    description="Road and trail running: shoe rotations and race recaps.",
    custom_url="@pacenotes",
    country="US",
    subscriber_count=57903,
)
COFFEE = Channel(id="UCbean", title="Bean Notes", description="Espresso deep dives and latte art.")
COMMENTS: list[Comment | str] = [
    Comment("Ug1", "@a", "Which shoe would you pick for a first trail marathon?", 3, 1, "2024"),
    "Great video as always.",
    "Loved the rocky trail test!",
]
SUMMARY = (
    "3 recent comments, tone positive; frequent words: trail, always, first, great; "
    "2 touch the brand's topics; 1 ask the creator a question."
)


async def test_offline_model_is_a_language_model_and_deterministic() -> None:
    model = OfflineModel()
    assert isinstance(model, LanguageModel)
    a = await draft_message(model, BRIEF, RUN)
    b = await draft_message(OfflineModel(), BRIEF, RUN)
    assert a == b and model.calls == 1
    assert a.tokens == a.tokens_in + a.tokens_out


async def test_summarize_comments() -> None:
    got = await summarize_comments(OfflineModel(), BRIEF, RUN, COMMENTS)
    assert got == Completion(SUMMARY, 124, 33)
    none = await summarize_comments(OfflineModel(), BRIEF, RUN, [])
    assert none.text == "No recent comments to summarize."


async def test_rationale_and_score_for_a_fitting_channel() -> None:
    model = OfflineModel()
    why = await rationale(model, BRIEF, RUN, comments_summary=SUMMARY)
    assert why.text == (
        "Fit: strong. Pace Notes TV covers trail running, which overlaps with Stridewell's "
        f"focus; 58K subscribers in US. Comments: {SUMMARY}"
    )
    value, completion = await score(model, BRIEF, RUN, why.text)
    assert value == 61
    assert completion.text == "Score: 61\nReason: strong topical fit (1/4 keywords)."


async def test_rationale_and_score_for_a_channel_that_does_not_fit() -> None:
    model = OfflineModel()
    why = await rationale(model, BRIEF, COFFEE)
    assert why.text == (
        "Fit: weak. Bean Notes is about: Espresso deep dives and latte art. Little overlap "
        "with Stridewell's keywords (running shoes, trail running, ultramarathon); an "
        "undisclosed audience."
    )
    value, _ = await score(model, BRIEF, COFFEE, why.text)
    assert 0 <= value <= 20


async def test_draft_message() -> None:
    draft = await draft_message(OfflineModel(), BRIEF, RUN)
    assert draft.text == (
        "Subject: Stridewell x Pace Notes TV\n\n"
        "Hi Pace Notes TV team,\n\n"
        "Your videos on trail running caught our team's attention. Stridewell makes "
        "lightweight trail running shoes.\n\n"
        "We think your audience would enjoy hearing about Stridewell. Would you be open to a "
        "short call about a paid collaboration? Happy to send samples and a one-page brief "
        "first.\n\n"
        "Best regards,\nPartnerships at Stridewell"
    )
    assert (draft.tokens_in, draft.tokens_out) == (113, 73)
    assert draft.tokens_out == count_tokens(draft.text)


async def test_max_tokens_truncates() -> None:
    short = await draft_message(OfflineModel(), BRIEF, RUN, max_tokens=5)
    assert short.text == "Subject: Stridewell x Pace"
    assert short.tokens_out == 5
    with pytest.raises(ValueError):
        await OfflineModel().complete("hello", max_tokens=0)


async def test_unknown_prompt_gets_a_generic_answer() -> None:
    got = await OfflineModel().complete(
        "Tell me about coffee, coffee beans and espresso.", max_tokens=50
    )
    assert got.text == "(offline model) Key points: coffee, beans, espresso, tell."


async def test_latency_is_simulated() -> None:
    start = time.perf_counter()
    await OfflineModel(latency=0.05).complete("x", max_tokens=5)
    assert time.perf_counter() - start >= 0.05
    with pytest.raises(ValueError):
        OfflineModel(latency=-1)


def test_parse_score() -> None:
    assert parse_score("Score: 87\nbecause") == 87
    assert parse_score("I'd give it a score = 40 overall") == 40
    assert parse_score("SCORE 0") == 0
    for bad in ("no number here", "Score: 150", "Score: -5", "scored 80"):
        with pytest.raises(ScoreParseError):
            parse_score(bad)


class Canned:
    """A language model that always answers the same text."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.prompts: list[str] = []

    async def complete(self, prompt: str, *, max_tokens: int) -> Completion:
        self.prompts.append(prompt)
        return Completion(self.text, count_tokens(prompt), count_tokens(self.text))


async def test_any_model_plugs_in() -> None:
    model = Canned("Score: 72 - a good fit")
    assert isinstance(model, LanguageModel)
    value, completion = await score(model, BRIEF, RUN, "Fit: strong.")
    assert value == 72 and completion.text == "Score: 72 - a good fit"
    prompt = model.prompts[0]
    assert prompt.startswith("Task: score\nBrand: Stridewell\n")
    assert "Channel subscribers: 57903" in prompt and "Rationale: Fit: strong." in prompt
    assert prompt.rstrip().endswith("then one sentence of reasons.")
    with pytest.raises(ScoreParseError):
        await score(Canned("It fits well."), BRIEF, RUN, "Fit: strong.")
