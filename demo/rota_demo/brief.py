"""A brand's brief, built from its web page.

:func:`fetch_page` downloads any http(s) URL (with a size cap and clear errors);
:func:`build_brief` parses the HTML with the standard library's :mod:`html.parser` and
returns a :class:`Brief`: brand name, summary, keywords and 1–3 search queries for finding
matching YouTube creators. Keyword extraction is simple and deterministic: weighted word and
two-word-phrase counts over the title, descriptions, headings and main text.

Sample brand pages ship in ``rota_demo/pages`` (:data:`PAGES_DIR`, :func:`sample_pages`);
:func:`pages_app` serves them (use :func:`rota_demo.loopback.serve_in_thread` for loopback).
"""

# One module, about 500 lines, on purpose: fetching, parsing and the sample pages serve one
# step of the example (a brand's page becomes a brief), and the parser's heuristics read best
# next to the Brief they fill; each part alone would be a thin file that the others import.

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import httpx
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from rota import RotaError

from .payloads import Payload

__all__ = [
    "MAX_PAGE_BYTES",
    "PAGES_DIR",
    "Brief",
    "PageError",
    "PageTooLarge",
    "build_brief",
    "fetch_page",
    "pages_app",
    "sample_pages",
]

#: Where the sample brand pages live (``*.html``).
PAGES_DIR: Final = Path(__file__).resolve().parent / "pages"
#: Default cap on a fetched page's body, in bytes.
MAX_PAGE_BYTES: Final = 2_000_000
_KEYWORDS: Final = 8


# --------------------------------------------------------------------------------------
# Fetching


class PageError(RotaError):
    """A page could not be fetched: bad URL, network error, timeout, non-2xx status, not
    HTML, or too large. ``url`` is the URL asked for; ``status`` the HTTP status when there
    was an answer, else ``None``."""

    def __init__(self, message: str, *, url: str, status: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status


class PageTooLarge(PageError):
    """The body is larger than the cap (``max_bytes``)."""


_HTML_TYPES: Final = ("text/html", "application/xhtml+xml", "text/plain")
_META_CHARSET: Final = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([a-zA-Z0-9_\-]+)""", re.I)


async def fetch_page(
    url: str,
    http: httpx.AsyncClient,
    *,
    max_bytes: int = MAX_PAGE_BYTES,
    read_timeout: float = 10.0,
) -> str:
    """GET ``url`` (http or https, redirects followed) and return its body as text.

    ``http``: the caller's client (not closed). ``max_bytes``: cap on the body in bytes;
    reading stops and :class:`PageTooLarge` is raised beyond it. ``read_timeout``: seconds per
    phase (connect, each read). The text is decoded with the response's charset, else a
    ``<meta charset>``, else UTF-8 (undecodable bytes replaced). Raises :class:`PageError`
    for a URL that is not http(s), a network error or timeout, a non-2xx status, or a
    content type that is not HTML (or plain text).
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise PageError(f"not an http(s) URL: {url!r}", url=url)
    try:
        async with http.stream("GET", url, follow_redirects=True, timeout=read_timeout) as response:
            if not response.is_success:
                raise PageError(
                    f"GET {url}: HTTP {response.status_code}", url=url, status=response.status_code
                )
            ctype = response.headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype and ctype not in _HTML_TYPES:
                raise PageError(
                    f"GET {url}: not an HTML page ({ctype})", url=url, status=response.status_code
                )
            declared = response.headers.get("content-length")
            if declared and declared.isdigit() and int(declared) > max_bytes:
                raise PageTooLarge(
                    f"GET {url}: {declared} bytes, more than the {max_bytes}-byte cap",
                    url=url,
                    status=response.status_code,
                )
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > max_bytes:
                    raise PageTooLarge(
                        f"GET {url}: more than the {max_bytes}-byte cap",
                        url=url,
                        status=response.status_code,
                    )
                chunks.append(chunk)
            charset = response.charset_encoding
    except httpx.TimeoutException as exc:
        raise PageError(f"GET {url}: timed out after {read_timeout:g}s", url=url) from exc
    except httpx.HTTPError as exc:
        raise PageError(f"GET {url}: {type(exc).__name__}: {exc}", url=url) from exc
    raw = b"".join(chunks)
    if charset is None:
        found = _META_CHARSET.search(raw[:4096])
        charset = found.group(1).decode("ascii") if found else "utf-8"
    try:
        return raw.decode(charset, errors="replace")
    except LookupError:
        return raw.decode("utf-8", errors="replace")


# --------------------------------------------------------------------------------------
# Parsing


@dataclass(frozen=True)
class Brief(Payload):
    """What the pipeline knows about a brand, from its page.

    ``brand``: the brand's name; ``summary``: one or two sentences (≤ 300 characters);
    ``keywords``: up to 8 terms (words or two-word phrases, lowercase), most important
    first; ``search_queries``: 1–3 queries for ``search.list``; ``title``, ``description``
    (meta description, may be empty), ``headings`` (h1–h3 text in page order) and ``og``
    (``og:*`` properties without the prefix, e.g. ``{"site_name": ...}``) as found.
    """

    url: str
    brand: str
    summary: str
    keywords: list[str]
    search_queries: list[str]
    title: str = ""
    description: str = ""
    headings: list[str] = field(default_factory=list)
    og: dict[str, str] = field(default_factory=dict)


_SKIP_TAGS: Final = frozenset({"script", "style", "noscript", "template", "svg", "iframe"})
_CHROME_TAGS: Final = frozenset({"nav", "footer"})
_VOID_TAGS: Final = frozenset(
    "area base br col embed hr img input link meta param source track wbr".split()
)
_BLOCK_TAGS: Final = frozenset(
    "p li h1 h2 h3 h4 h5 h6 div section article aside blockquote td th dt dd tr main header "
    "footer nav ul ol figure figcaption button form table pre address br hr title body".split()
)
_HEADINGS: Final = frozenset({"h1", "h2", "h3"})


@dataclass
class _Block:
    text: str
    tag: str
    in_main: bool
    in_chrome: bool


class _PageParser(HTMLParser):
    """Collects the title, meta/og tags and text blocks of an HTML document."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.title = ""
        self.meta: dict[str, str] = {}
        self.blocks: list[_Block] = []
        self._skip = 0
        self._chrome = 0
        self._main = 0
        self._in_title = False
        self._in_body = False
        self._buf: list[str] = []
        self._tags: list[str] = []  # innermost open block-ish tag names

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "meta":
            a = {k.lower(): (v or "") for k, v in attrs}
            key = (a.get("property") or a.get("name") or "").strip().lower()
            if key and key not in self.meta:
                self.meta[key] = " ".join(a.get("content", "").split())
            return
        if tag in _VOID_TAGS:
            if tag in _BLOCK_TAGS:
                self._flush()
            return
        if tag in _SKIP_TAGS:
            self._skip += 1
            return
        if tag == "title":
            self._in_title = True
            return
        if tag in _BLOCK_TAGS:
            self._flush()
            self._tags.append(tag)
        if tag == "body":
            self._in_body = True
        if tag == "main" or (tag == "div" and ("role", "main") in attrs):
            self._main += 1
        elif tag in _CHROME_TAGS or (tag == "header" and self._main == 0):
            self._chrome += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP_TAGS:
            self._skip = max(self._skip - 1, 0)
            return
        if tag == "title":
            self._in_title = False
            return
        if tag in _BLOCK_TAGS:
            self._flush()
            if tag in self._tags:
                while self._tags and self._tags.pop() != tag:
                    pass
        if tag == "main":
            self._main = max(self._main - 1, 0)
        elif tag in _CHROME_TAGS or (tag == "header" and self._main == 0):
            self._chrome = max(self._chrome - 1, 0)

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        if self._in_title:
            self.title += data
            return
        self._buf.append(data)

    def close(self) -> None:
        super().close()
        self._flush()
        self.title = " ".join(self.title.split())

    def _flush(self) -> None:
        text = " ".join("".join(self._buf).split())
        self._buf = []
        if not text:
            return
        tag = self._tags[-1] if self._tags else ""
        # A heading's inline children (a, span) end up in the heading's block.
        self.blocks.append(_Block(text, tag, self._main > 0, self._chrome > 0))


_STOPWORDS: Final = frozenset(
    """a about above after again against all also am an and any are aren't as at be because
    been before being below between both but by can can't cannot could did do does doing don't
    down during each every few for from further had has have having he her here hers herself
    him himself his how i if in into is isn't it it's its itself just let's me more most my
    myself no nor not now of off on once only or other our ours ourselves out over own same
    she should so some such than that that's the their theirs them themselves then there
    these they this those through to too under until up very was we were what when where
    which while who whom why will with would you your yours yourself yourselves
    one two three four five six seven eight nine ten first every many much may might must
    us via per get gets got make makes made like new best free now out see use used using
    day days week weeks month months year years time times way ways lot lots thing things
    home shop store cart account login log sign signup privacy cookie cookies terms menu
    search click here read learn more page site website inc ltd co com www http https
    whole stops actually hope arrive arrives reaches reach side try work works worked built
    build builds tested test tests make making need needs want wants give gives keep keeps
    take takes know great simple simply better really little perfect within without
    hour hours minute minutes""".split()
)
_TOKEN: Final = re.compile(r"[A-Za-z0-9]+(?:['’-][A-Za-z0-9]+)*")
_SPLIT_TITLE: Final = re.compile(r"\s+[|–—·•-]\s+|\s*[|–—·•]\s*|:\s+")
_CLAUSE_BREAK: Final = re.compile(r"[,.;:!?()\[\]{}\"“”/|–—•·…]+|\s-\s")
_SENTENCE_END: Final = re.compile(r"(?<=[.!?])\s+")


def _tokens(text: str) -> list[str]:
    """Lowercased word tokens; a possessive 's is dropped."""
    return [tok for tok, _ in _cased_tokens(text)]


def _cased_tokens(text: str) -> list[tuple[str, bool]]:
    """Lowercased word tokens, each with whether it was written all in lowercase."""
    out = []
    for tok in _TOKEN.findall(text.replace("’", "'")):
        low = tok.lower()
        if low.endswith("'s"):
            low = low[:-2]
        out.append((low, tok == low))
    return out


def _is_term(tok: str) -> bool:
    return len(tok) >= 3 and tok not in _STOPWORDS and "'" not in tok and tok[0].isalpha()


def _norm(text: str) -> list[str]:
    """Alphanumeric squashes of a name, with '&' read as 'and' and as nothing."""
    low = text.lower()
    return [re.sub(r"[^a-z0-9]", "", low.replace("&", "and")), re.sub(r"[^a-z0-9]", "", low)]


def _url_stems(url: str) -> list[str]:
    parts = urlsplit(url)
    stems = []
    host = (parts.hostname or "").lower()
    labels = [x for x in host.split(".") if x and x != "www"]
    if labels and not host.replace(".", "").isdigit() and host != "localhost" and ":" not in host:
        stems.append(re.sub(r"[^a-z0-9]", "", labels[0]))
    last = parts.path.rstrip("/").rsplit("/", 1)[-1]
    last = re.sub(r"\.[a-z0-9]+$", "", last.lower())
    if last and last != "index":
        stems.append(re.sub(r"[^a-z0-9]", "", last))
    return [s for s in stems if len(s) >= 3]


def _brand(title: str, og: Mapping[str, str], url: str) -> str:
    if og.get("site_name"):
        return og["site_name"]
    segments = [s.strip() for s in _SPLIT_TITLE.split(title) if s.strip()]
    stems = _url_stems(url)
    for seg in segments:
        if any(stem in n or (n and n in stem) for stem in stems for n in _norm(seg)):
            return seg
    if len(segments) > 1:
        return min(segments, key=len)
    if stems:
        return stems[0].capitalize()
    return segments[0] if segments else (urlsplit(url).hostname or url)


def _summary(description: str, og: Mapping[str, str], paragraphs: Iterable[str]) -> str:
    text = description or og.get("description", "")
    if not text:
        text = next((p for p in paragraphs if len(p.split()) >= 8), "")
    if len(text) <= 300:
        return text
    out = ""
    for sentence in _SENTENCE_END.split(text):
        if len(out) + len(sentence) + 1 > 300:
            break
        out = f"{out} {sentence}".strip()
    return out or text[:297].rsplit(" ", 1)[0] + "…"


class _Terms:
    """Weighted counts of words and adjacent word pairs, in first-seen order."""

    def __init__(self) -> None:
        self.score: dict[str, float] = {}
        self.seen: dict[str, int] = {}
        self.lower: set[str] = set()  # terms written in lowercase at least once
        self.order: dict[str, int] = {}

    def add(self, term: str, weight: float, lower: bool, times: int = 1) -> None:
        self.score[term] = self.score.get(term, 0.0) + weight
        self.seen[term] = self.seen.get(term, 0) + times
        self.order.setdefault(term, len(self.order))
        if lower:
            self.lower.add(term)

    def add_text(self, text: str, weight: float) -> None:
        for clause in _CLAUSE_BREAK.split(text):  # a phrase never spans punctuation
            toks = _cased_tokens(clause)
            for i, (tok, lower) in enumerate(toks):
                if not _is_term(tok):
                    continue
                self.add(tok, weight, lower)
                if i + 1 < len(toks) and _is_term(toks[i + 1][0]):
                    nxt, nxt_lower = toks[i + 1]
                    self.add(f"{tok} {nxt}", weight * 1.5, lower and nxt_lower)


def _keywords(terms: _Terms, brand_words: frozenset[str]) -> list[str]:
    """Top terms by weighted count. A two-word phrase counts when seen at least twice;
    the brand's own words are left out unless the page also uses them in lowercase (so
    "coffee" stays for "Ember & Oak Coffee Roasters", "ember" does not)."""

    def allowed(term: str) -> bool:
        words = term.split()
        if any(w in brand_words and w not in terms.lower for w in words):
            return False
        return len(words) == 1 or terms.seen[term] >= 2

    ranked = sorted(
        (t for t in terms.score if allowed(t)), key=lambda t: (-terms.score[t], terms.order[t])
    )
    chosen: list[str] = []
    for term in ranked:
        words = term.split()
        # Skip a word already inside a chosen phrase, and a phrase made of chosen words.
        flat = term.replace("-", " ")
        if len(words) == 1 and any(f" {flat} " in f" {c} " for c in chosen):
            continue
        if len(words) > 1 and all(w in chosen for w in words):
            continue
        if len(words) > 1:  # a phrase replaces the single words it contains
            chosen = [c for c in chosen if c not in words]
        chosen.append(term)
        if len(chosen) == _KEYWORDS:
            break
    return chosen


def _queries(keywords: list[str], terms: _Terms, brand: str) -> list[str]:
    """1–3 creator searches: the top phrases written in lowercase (topics, not names)."""
    topical = [k for k in keywords if k in terms.lower]
    phrases = [k for k in topical if " " in k]
    words = [k for k in topical if " " not in k]
    queries = phrases[:3]
    if not queries and len(words) >= 2:
        queries.append(f"{words[0]} {words[1]}")
    elif not queries and words:
        queries.append(words[0])
    return queries or [brand]


def build_brief(html: str, url: str) -> Brief:
    """Parse a brand's page (``html``, fetched from ``url``) into a :class:`Brief`.

    Uses :class:`html.parser.HTMLParser`; scripts, styles, navigation and footers are
    ignored, and text inside ``<main>`` is preferred when the page has one. The brand is
    ``og:site_name``, else the title segment that matches the URL's host or file name, else
    the shortest title segment. The summary is the meta description (or ``og:description``,
    or the first paragraph), at most 300 characters. Deterministic: the same input gives
    the same brief. Never raises on malformed HTML.
    """
    parser = _PageParser()
    parser.feed(html)
    parser.close()
    meta = parser.meta
    og = {k[3:]: v for k, v in meta.items() if k.startswith("og:") and v}
    title = parser.title or og.get("title", "")
    description = meta.get("description", "")

    blocks = [b for b in parser.blocks if not b.in_chrome]
    if any(b.in_main for b in blocks):
        blocks = [b for b in blocks if b.in_main]
    headings = [b.text for b in blocks if b.tag in _HEADINGS]
    paragraphs = [b.text for b in blocks if b.tag not in _HEADINGS and b.tag != "title"]

    brand = _brand(title, og, url)
    title_rest = " ".join(s for s in _SPLIT_TITLE.split(title) if s.strip() and s != brand)
    fields: list[tuple[str, float]] = [(title_rest, 3.0)]
    fields += [(text, 2.0) for text in (description, og.get("description", ""))]
    fields += [(og.get("title", ""), 2.0)]
    fields += [(h, 2.0) for h in headings]
    fields += [(p, 1.0) for p in paragraphs]
    terms = _Terms()
    for phrase in meta.get("keywords", "").split(","):  # meta keywords: taken as given
        words = [w for w in _tokens(phrase) if w not in _STOPWORDS]
        if 1 <= len(words) <= 3:
            terms.add(" ".join(words), 3.0, lower=True, times=2)
    done: set[str] = set()
    for text, weight in fields:
        key = " ".join(_tokens(text))
        if key and key not in done:  # og:title often repeats the title: count it once
            done.add(key)
            terms.add_text(text, weight)
    keywords = _keywords(terms, frozenset(_tokens(brand)))
    return Brief(
        url=url,
        brand=brand,
        summary=_summary(description, og, paragraphs),
        keywords=keywords,
        search_queries=_queries(keywords, terms, brand),
        title=title,
        description=description,
        headings=headings,
        og=og,
    )


# --------------------------------------------------------------------------------------
# Sample pages


def sample_pages() -> list[str]:
    """File names of the sample brand pages in :data:`PAGES_DIR`, sorted."""
    return sorted(p.name for p in PAGES_DIR.glob("*.html"))


def pages_app(directory: Path = PAGES_DIR) -> Starlette:
    """A Starlette app serving ``directory`` as static files at ``/`` (``/stridewell.html``
    …); unknown paths get 404. Serve it with :func:`rota_demo.loopback.serve_in_thread`."""
    return Starlette(routes=[Mount("/", StaticFiles(directory=directory, html=True))])
