"""A pluggable language model, an offline default, and the prompts the demo handlers use.

Any object with ``async def complete(prompt, *, max_tokens) -> Completion`` is a
:class:`LanguageModel`. :class:`OfflineModel` needs no network: it reads the ``Key: value``
header that :func:`draft_message`, :func:`rationale`, :func:`score` and
:func:`summarize_comments` put at the top of their prompts and fills a template, so its
output is deterministic (same prompt, same text) and good enough to show the pipeline.
A real model gets the same prompt, whose last paragraph states the task in plain words.

Tokens are counted with :func:`count_tokens` (words and punctuation marks), an
approximation good enough for a run summary's "tokens spent".
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

from .brief import Brief
from .youtube import Channel, Comment

__all__ = [
    "Completion",
    "LanguageModel",
    "ModelRateLimited",
    "OfflineModel",
    "ScoreParseError",
    "count_tokens",
    "draft_message",
    "parse_score",
    "rationale",
    "score",
    "summarize_comments",
]

_TOKEN: Final = re.compile(r"\w+|[^\w\s]")
_FIELD: Final = re.compile(r"^([A-Z][A-Za-z ]{0,40}):[ \t]*(.*)$")
_WORD: Final = re.compile(r"[a-z][a-z'-]+")
_SCORE: Final = re.compile(r"\bscore\b\s*[:=]?\s*(-?\d{1,3})\b", re.I)


@dataclass(frozen=True)
class Completion:
    """A model's answer: ``text``, and the prompt's and answer's sizes in tokens."""

    text: str
    tokens_in: int
    tokens_out: int

    @property
    def tokens(self) -> int:
        """``tokens_in + tokens_out``."""
        return self.tokens_in + self.tokens_out


@runtime_checkable
class LanguageModel(Protocol):
    """Anything that completes a prompt.

    ``complete(prompt, max_tokens=N)``: ``prompt`` is plain text; the answer has at most
    ``max_tokens`` tokens (``max_tokens >= 1``). Implementations raise on failure (network,
    rate limit…); the job then fails and is retried with backoff.
    """

    async def complete(self, prompt: str, *, max_tokens: int) -> Completion: ...


class ModelRateLimited(Exception):
    """The model's provider answered HTTP 429: too many requests. ``retry_after`` is its
    ``Retry-After`` header, in seconds. A handler tells rota, so every worker holds off
    (``ctx.backoff(limit, exc.retry_after)``), rather than failing the job."""

    def __init__(self, retry_after: float, why: str = "requests per minute") -> None:
        super().__init__(f"language model: 429 too many requests ({why}); retry after "
                         f"{retry_after:g} s")
        self.retry_after = retry_after


def count_tokens(text: str) -> int:
    """Approximate token count: words plus punctuation marks."""
    return len(_TOKEN.findall(text))


def _truncate(text: str, max_tokens: int) -> str:
    matches = list(_TOKEN.finditer(text))
    if len(matches) <= max_tokens:
        return text
    return text[: matches[max_tokens - 1].end()]


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _fields(prompt: str) -> dict[str, list[str]]:
    """The ``Key: value`` lines of a prompt's header (up to its first blank line after the
    first field), keys lowercased; repeated keys keep every value."""
    out: dict[str, list[str]] = {}
    for line in prompt.splitlines():
        if not line.strip():
            if out:
                break
            continue
        m = _FIELD.match(line)
        if m:
            out.setdefault(m.group(1).strip().lower(), []).append(m.group(2).strip())
    return out


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _human(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    if n >= 1_000:
        return f"{n / 1_000:.0f}K"
    return str(n)


class OfflineModel:
    """A deterministic, template-based stand-in for a language model; no network.

    ``latency``: seconds each call sleeps (simulated model time); ``jitter``: up to this
    many extra seconds, a fixed fraction per prompt. ``calls`` counts completions.
    The same prompt always gives the same text.
    """

    def __init__(self, *, latency: float = 0.0, jitter: float = 0.0) -> None:
        if latency < 0 or jitter < 0:
            raise ValueError("latency and jitter must be >= 0 seconds")
        self.latency = latency
        self.jitter = jitter
        self.calls = 0

    async def complete(self, prompt: str, *, max_tokens: int) -> Completion:
        """Answer ``prompt`` from its header's template (see the module docstring);
        at most ``max_tokens`` tokens. Raises ``ValueError`` if ``max_tokens < 1``."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        delay = self.latency + self.jitter * (_hash(prompt) % 1000) / 1000
        if delay:
            await asyncio.sleep(delay)
        self.calls += 1
        fields = _fields(prompt)
        task = (fields.get("task") or [""])[0]
        writer = _TEMPLATES.get(task, _generic)
        text = _truncate(writer(fields, prompt), max_tokens)
        return Completion(text, count_tokens(prompt), count_tokens(text))


# --------------------------------------------------------------------------------------
# The offline model's templates. Each reads the header fields of its task's prompt.


def _get(fields: dict[str, list[str]], key: str, default: str = "") -> str:
    values = fields.get(key)
    return values[0] if values else default


def _overlap(fields: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    """(brand keywords, those whose words all appear in the channel's text)."""
    keywords = [k.strip() for k in _get(fields, "brand keywords").split(",") if k.strip()]
    channel_text = " ".join(
        _get(fields, k) for k in ("channel", "channel description", "comments summary")
    )
    vocab = set(_words(channel_text))
    vocab |= {w[:-1] for w in vocab if w.endswith("s")}  # "shoes" matches "shoe"
    matched = [k for k in keywords if all(w in vocab for w in _words(k))]
    return keywords, matched


def _topic(fields: dict[str, list[str]]) -> str:
    keywords, matched = _overlap(fields)
    if matched:
        return " and ".join(matched[:2])
    return keywords[0] if keywords else "your niche"


def _draft(fields: dict[str, list[str]], prompt: str) -> str:
    brand = _get(fields, "brand", "our brand")
    channel = _get(fields, "channel", "there")
    topic = _topic(fields)
    openers = (
        f"I've been watching {channel} and really like how you cover {topic}.",
        f"Your videos on {topic} caught our team's attention.",
        f"We came across {channel} while looking for creators who talk about {topic}.",
    )
    opener = openers[_hash(prompt) % len(openers)]
    summary = _get(fields, "brand summary")
    first = re.split(r"(?<=[.!?])\s+", summary)[0] if summary else f"{brand} makes things."
    return (
        f"Subject: {brand} x {channel}\n\n"
        f"Hi {channel} team,\n\n"
        f"{opener} {first}\n\n"
        f"We think your audience would enjoy hearing about {brand}. Would you be open to a "
        "short call about a paid collaboration? Happy to send samples and a one-page brief "
        "first.\n\n"
        f"Best regards,\nPartnerships at {brand}"
    )


def _fit(fields: dict[str, list[str]]) -> tuple[str, list[str], list[str]]:
    keywords, matched = _overlap(fields)
    share = len(matched) / len(keywords) if keywords else 0.0
    level = "strong" if share >= 0.25 else "moderate" if matched else "weak"
    return level, keywords, matched


def _rationale(fields: dict[str, list[str]], prompt: str) -> str:
    brand = _get(fields, "brand", "the brand")
    channel = _get(fields, "channel", "This channel")
    level, keywords, matched = _fit(fields)
    subs = _get(fields, "channel subscribers")
    country = _get(fields, "channel country", "unknown")
    audience = f"{_human(int(subs))} subscribers" if subs.isdigit() else "an undisclosed audience"
    if country != "unknown":
        audience += f" in {country}"
    if matched:
        body = (
            f"{channel} covers {', '.join(matched[:3])}, which overlaps with {brand}'s focus; "
            f"{audience}."
        )
    else:
        about = _get(fields, "channel description", "other topics").split(".")[0]
        body = (
            f"{channel} is about: {about}. Little overlap with {brand}'s keywords "
            f"({', '.join(keywords[:3]) or 'none given'}); {audience}."
        )
    comments = _get(fields, "comments summary")
    tail = f" Comments: {comments}" if comments else ""
    return f"Fit: {level}. {body}{tail}"


def _score(fields: dict[str, list[str]], prompt: str) -> str:
    level, keywords, matched = _fit(fields)
    share = len(matched) / len(keywords) if keywords else 0.0
    raw_subs = _get(fields, "channel subscribers").replace(",", "")
    size = 0.0
    if raw_subs.isdigit() and int(raw_subs) > 0:
        size = min(max((math.log10(int(raw_subs)) - 3) / 3, 0.0), 1.0)
    stated = re.match(r"\s*fit:\s*(strong|moderate|weak)", _get(fields, "rationale"), re.I)
    adjust = {"strong": 5, "moderate": 0, "weak": -10}[stated.group(1).lower()] if stated else 0
    value = 15 + round(60 * min(share * 2, 1.0)) + round(15 * size) + adjust + _hash(prompt) % 5
    value = max(0, min(100, value))
    return f"Score: {value}\nReason: {level} topical fit ({len(matched)}/{len(keywords)} keywords)."


def _comments(fields: dict[str, list[str]], prompt: str) -> str:
    comments = fields.get("comment", [])
    if not comments:
        return "No recent comments to summarize."
    keywords = [k.strip() for k in _get(fields, "brand keywords").split(",") if k.strip()]
    words = Counter(w for c in comments for w in set(_words(c)) if len(w) > 3 and w not in _COMMON)
    top = [w for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0]))[:4]]
    kw_words = {w for k in keywords for w in _words(k)}
    on_topic = sum(1 for c in comments if kw_words & set(_words(c)))
    questions = sum(1 for c in comments if "?" in c)
    positive = sum(1 for c in comments if set(_words(c)) & _POSITIVE)
    tone = "positive" if positive * 2 >= len(comments) else "mixed"
    return (
        f"{len(comments)} recent comments, tone {tone}; frequent words: "
        f"{', '.join(top) or 'none'}; {on_topic} touch the brand's topics; "
        f"{questions} ask the creator a question."
    )


def _generic(fields: dict[str, list[str]], prompt: str) -> str:
    words = Counter(w for w in _words(prompt) if len(w) > 3 and w not in _COMMON)
    top = [w for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0]))[:5]]
    return f"(offline model) Key points: {', '.join(top) or 'none'}."


_COMMON: Final = frozenset(
    "this that with your from have what will would could about just they them their there "
    "been were when which more most very much like into than then also only over some such "
    "thanks thank video videos please".split()
)
_POSITIVE: Final = frozenset(
    "love loved great gold gorgeous helpful amazing awesome best good thanks nice "
    "perfect favourite favorite enjoy enjoyed unreal".split()
)
_TEMPLATES: Final = {
    "draft_message": _draft,
    "rationale": _rationale,
    "score": _score,
    "summarize_comments": _comments,
}


# --------------------------------------------------------------------------------------
# Prompts and the calls the demo handlers make


def _header(task: str, brief: Brief, channel: Channel) -> list[str]:
    subs = "hidden" if channel.subscriber_count is None else str(channel.subscriber_count)
    return [
        f"Task: {task}",
        f"Brand: {brief.brand}",
        f"Brand summary: {' '.join(brief.summary.split())}",
        f"Brand keywords: {', '.join(brief.keywords)}",
        f"Channel: {channel.title}",
        f"Channel handle: {channel.custom_url or 'none'}",
        f"Channel description: {' '.join(channel.description.split())}",
        f"Channel subscribers: {subs}",
        f"Channel country: {channel.country or 'unknown'}",
    ]


def _one_line(text: str) -> str:
    return " ".join(text.split())


async def _ask(model: LanguageModel, task: str, brief: Brief, channel: Channel,
               comments_summary: str, max_tokens: int, instruction: str) -> Completion:
    """The prompt every per-channel call sends: the brand and channel header, the
    comments summary when there is one, then the task's instruction."""
    lines = _header(task, brief, channel)
    if comments_summary:
        lines.append(f"Comments summary: {_one_line(comments_summary)}")
    lines += ["", instruction]
    return await model.complete("\n".join(lines), max_tokens=max_tokens)


async def draft_message(model: LanguageModel, brief: Brief, channel: Channel, *,
                        comments_summary: str = "", max_tokens: int = 300) -> Completion:
    """Draft a first outreach message from the brand to the channel (text starts with a
    ``Subject:`` line). ``comments_summary``: optional output of :func:`summarize_comments`.
    Raises whatever the model raises."""
    return await _ask(
        model, "draft_message", brief, channel, comments_summary, max_tokens,
        f"Write a short, friendly first email from {brief.brand}'s partnerships team to the "
        "creator above, proposing a paid collaboration. Start with a 'Subject:' line. "
        "Mention what the channel covers that fits the brand. No more than 150 words.")


async def rationale(model: LanguageModel, brief: Brief, channel: Channel, *,
                    comments_summary: str = "", max_tokens: int = 120) -> Completion:
    """Explain in two or three sentences why the channel does or does not fit the brand
    (the offline model's text starts ``Fit: strong|moderate|weak.``)."""
    return await _ask(
        model, "rationale", brief, channel, comments_summary, max_tokens,
        "In two or three sentences, say why this YouTube channel is or is not a good fit for "
        "the brand's creator campaign. Start with 'Fit: strong', 'Fit: moderate' or "
        "'Fit: weak'.")


class ScoreParseError(ValueError):
    """The model's answer has no ``Score: N`` with N in 0–100. ``text`` is the answer."""

    def __init__(self, text: str) -> None:
        super().__init__(f"no 'Score: 0-100' in the model's answer: {text[:120]!r}")
        self.text = text


def parse_score(text: str) -> int:
    """The first ``Score: N`` (case-insensitive, ``:`` or ``=`` optional) in ``text``, as an
    int 0–100. Raises :class:`ScoreParseError` when absent or out of range."""
    found = _SCORE.search(text)
    if not found:
        raise ScoreParseError(text)
    value = int(found.group(1))
    if not 0 <= value <= 100:
        raise ScoreParseError(text)
    return value


async def score(
    model: LanguageModel,
    brief: Brief,
    channel: Channel,
    rationale_text: str,
    *,
    max_tokens: int = 60,
) -> tuple[int, Completion]:
    """Score the channel's fit for the brand, 0 (none) to 100 (ideal), given the
    rationale. Returns ``(score, completion)``. Raises :class:`ScoreParseError` when the
    answer holds no score (the job then fails and is retried), or whatever the model
    raises."""
    lines = _header("score", brief, channel)
    lines.append(f"Rationale: {_one_line(rationale_text)}")
    lines += [
        "",
        "Rate how well this channel fits the brand's creator campaign from 0 (no fit) to 100 "
        "(ideal). Answer with 'Score: N' on the first line, then one sentence of reasons.",
    ]
    completion = await model.complete("\n".join(lines), max_tokens=max_tokens)
    return parse_score(completion.text), completion


async def summarize_comments(
    model: LanguageModel,
    brief: Brief,
    channel: Channel,
    comments: Sequence[Comment | str],
    *,
    max_comments: int = 20,
    max_tokens: int = 120,
) -> Completion:
    """Summarize what the channel's audience talks about, in one or two sentences.

    ``comments``: :class:`~rota_demo.youtube.Comment` objects or plain texts; the first
    ``max_comments`` are used, each as one ``Comment:`` line (newlines flattened)."""
    lines = _header("summarize_comments", brief, channel)
    for c in list(comments)[:max_comments]:
        text = c.text if isinstance(c, Comment) else c
        if text.strip():
            lines.append(f"Comment: {_one_line(text)}")
    lines += [
        "",
        "Summarize in one or two sentences what this channel's audience talks about in the "
        "comments above, their tone, and whether they would care about the brand.",
    ]
    return await model.complete("\n".join(lines), max_tokens=max_tokens)
