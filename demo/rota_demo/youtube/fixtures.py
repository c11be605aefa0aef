"""The stand-in's fixture data: a deterministic pool of fake channels over ten topics,
with the names, descriptions and comments its answers are made of. Everything is derived
from a seed by hashing, so a seed always gives the same channels, ids and comments."""

from __future__ import annotations

import base64
import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final


@dataclass(frozen=True)
class Topic:
    """One subject of the pool: the search words that find it, and its channels'
    show names, descriptions and comments."""

    name: str
    words: frozenset[str]
    shows: tuple[str, ...]
    blurbs: tuple[str, ...]
    comments: tuple[str, ...]


def _topic(
    name: str, words: str, shows: Sequence[str], blurbs: Sequence[str], comments: Sequence[str]
) -> Topic:
    return Topic(name, frozenset(words.split()), tuple(shows), tuple(blurbs), tuple(comments))


TOPICS: Final[tuple[Topic, ...]] = (
    _topic(
        "running",
        "running run runs runner runners marathon marathons trail trails ultra ultramarathon "
        "shoes shoe sneakers jogging race racing 5k 10k pace stride training",
        ["Trail Miles", "Long Run", "Stride Lab", "Pace Notes", "Ultra Diaries", "Run Club"],
        [
            "Honest running shoe reviews, trail races and marathon training logs.",
            "Ultramarathon vlogs, gear tests and weekly long runs in the mountains.",
            "Road and trail running: shoe rotations, race recaps and training plans.",
        ],
        [
            "Which shoe would you pick for a first trail marathon?",
            "Your long-run pacing tips got me through my first 10k.",
            "How many miles do you get out of a pair before retiring them?",
            "The rocky trail test was exactly what I needed, thanks!",
        ],
    ),
    _topic(
        "coffee",
        "coffee coffees espresso roaster roasters roast roasting brew brewing latte barista "
        "beans bean pour pourover grinder specialty origin cafe",
        ["Daily Grind", "Espresso Lab", "Slow Pour", "Bean Notes", "Morning Cup", "Roast Ratio"],
        [
            "Specialty coffee at home: brewing guides, grinder tests and roaster visits.",
            "Espresso deep dives, latte art practice and single-origin tastings.",
            "Pour-over recipes, bean subscriptions reviewed and cafe tours.",
        ],
        [
            "What grind size do you use for the V60 recipe?",
            "Ordered the Ethiopian beans after this video, so fruity!",
            "Can you compare light and medium roasts for espresso?",
            "My morning routine is now your 1:16 ratio.",
        ],
    ),
    _topic(
        "gaming",
        "game games gaming gamer indie pixel rpg steam nintendo switch playthrough devlog "
        "roguelike platformer studio console pc",
        ["Pixel Hearts", "Indie Spotlight", "Save Point", "Co-op Couch", "Devlog Diaries"],
        [
            "Indie game reviews, hidden gems on Steam and cozy playthroughs.",
            "Roguelikes, platformers and interviews with small game studios.",
            "Let's plays and devlogs from the indie scene, every week.",
        ],
        [
            "Wishlisted it on Steam right after the stream.",
            "Is there a Switch version coming?",
            "The pixel art in this one is gorgeous.",
            "Please do a full playthrough of the demo!",
        ],
    ),
    _topic(
        "finance",
        "budget budgets budgeting money finance finances personal saving savings save debt "
        "invest investing frugal spending paycheck app apps bank",
        ["Money Plainly", "Budget Beans", "Frugal Friday", "Paycheck Plan", "Debt Free Diary"],
        [
            "Personal finance without jargon: budgeting, saving and paying off debt.",
            "Budgeting app reviews, zero-based budgets and monthly money check-ins.",
            "Frugal living, saving challenges and beginner investing explained.",
        ],
        [
            "Started zero-based budgeting after this and finally saved something.",
            "Which budgeting app do you actually use day to day?",
            "Paid off my card this month thanks to the envelope method!",
            "Could you do a video on budgeting with irregular income?",
        ],
    ),
    _topic(
        "fitness",
        "fitness workout workouts gym strength training cardio yoga mobility exercise "
        "health athlete recovery stretching",
        ["Strong Daily", "Mobility Minute", "Iron Notes", "Home Gym Hero", "Flow Yoga"],
        [
            "Home workouts, strength training and mobility routines for busy people.",
            "Gym programming, recovery tips and honest supplement talk.",
        ],
        [
            "Day 30 of this routine and my knees feel so much better.",
            "What do you eat before a morning workout?",
            "The mobility flow at the end is gold.",
        ],
    ),
    _topic(
        "outdoors",
        "hiking hike outdoor outdoors camping backpacking trail trails mountain mountains "
        "climbing gear adventure wilderness",
        ["Wild Miles", "Summit Stories", "Pack Light", "Basecamp Weekly", "Ridge Line"],
        [
            "Backpacking trips, ultralight gear and mountain adventures.",
            "Hiking guides, camping hacks and honest outdoor gear reviews.",
        ],
        [
            "That ridge at sunrise was unreal.",
            "What's your base weight for this trip?",
            "Adding this trail to my summer list.",
        ],
    ),
    _topic(
        "cooking",
        "cooking cook recipe recipes kitchen food baking bake chef meal meals breakfast",
        ["Weeknight Kitchen", "Crumb Club", "Sunday Sauce", "Pan to Plate"],
        [
            "Easy weeknight recipes, baking projects and kitchen gear tests.",
            "Cooking from scratch on a budget, one pan at a time.",
        ],
        [
            "Made this last night, the family loved it.",
            "Can I swap the butter for olive oil?",
            "Your sourdough tips finally worked for me!",
        ],
    ),
    _topic(
        "tech",
        "tech technology gadget gadgets review reviews smartphone phone laptop productivity "
        "software app apps setup desk",
        ["Byte Size", "Desk Setup", "Gadget Lab", "Plain Tech", "Pocket Review"],
        [
            "Gadget reviews, desk setups and productivity apps that earn their place.",
            "Straightforward tech reviews: phones, laptops and software.",
        ],
        [
            "Which app do you use for notes?",
            "Great review, ordered the same laptop stand.",
            "Please review more budget phones!",
        ],
    ),
    _topic(
        "travel",
        "travel traveling trip trips city cities guide backpacker flights hotel vanlife",
        ["Carry On", "Slow Travel", "City Guide", "Window Seat"],
        [
            "Slow travel guides, city walks and budget trip planning.",
            "Travel vlogs, packing lists and honest hotel reviews.",
        ],
        [
            "Saving this for my trip next spring!",
            "How did you find that little cafe?",
            "Your packing list is so helpful.",
        ],
    ),
    _topic(
        "music",
        "music musician guitar piano songs song producer beats synth band",
        ["Chord Club", "Bedroom Beats", "Fret Notes", "Synth Corner"],
        [
            "Guitar lessons, gear demos and songwriting sessions.",
            "Beat making, synth sounds and home studio tips.",
        ],
        [
            "Learned the riff in one evening thanks to you.",
            "What pedal is that at 3:12?",
            "More synth patches please!",
        ],
    ),
)

_HOSTS: Final = (
    "Sam", "Alex", "Maya", "Jordan", "Priya", "Chris", "Lena", "Diego", "Noor", "Kai",
    "Hana", "Tom", "Ines", "Marco", "Zoe", "Ravi", "Elif", "Jonas", "Ana", "Theo",
)  # fmt: skip
_FORMATS: Final = ("{show}", "{show} with {host}", "{host}'s {show}", "{show} TV", "{show} Weekly")
_COUNTRIES: Final = ("US", "US", "US", "GB", "CA", "AU", "DE", "FR", "IN", "BR", "NL", "JP")
AUTHORS: Final = ("runner", "maker", "fan", "viewer", "sub", "learner", "nerd", "friend")
GENERIC_COMMENTS: Final = (
    "Great video as always.",
    "Been watching since the early days, love the new format.",
    "The editing on this one is so good.",
    "Subscribed after the last upload!",
    "Would love a collab with a brand that gets your audience.",
)
WORD_RE: Final = re.compile(r"[a-z0-9]+")


def digest(*parts: object) -> bytes:
    """SHA-256 of the parts: every fake value is derived from one."""
    return hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()


def num(*parts: object) -> int:
    """A deterministic 64-bit number from the parts (ranks, seeds)."""
    return int.from_bytes(digest(*parts)[:8], "big")


def b64(raw: bytes, n: int) -> str:
    """``n`` URL-safe base64 characters, the shape of the API's ids and etags."""
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")[:n]


def iso(moment: datetime) -> str:
    """RFC 3339 in UTC, as the API writes its timestamps."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class FakeChannel:
    """One channel of the pool, as the stand-in answers it."""

    index: int
    id: str
    topic: Topic
    title: str
    handle: str
    description: str
    country: str
    subscribers: int
    hidden: bool
    videos: int
    views: int
    published_at: str


def make_pool(seed: int, size: int) -> list[FakeChannel]:
    """``size`` channels, the topics in turn; the same seed gives the same pool."""
    pool: list[FakeChannel] = []
    epoch = datetime(2008, 1, 1, tzinfo=UTC)
    for index in range(size):
        topic = TOPICS[index % len(TOPICS)]
        r = random.Random(num("channel", seed, index))
        show = r.choice(topic.shows)
        title = r.choice(_FORMATS).format(show=show, host=r.choice(_HOSTS))
        handle = "@" + re.sub(r"[^a-z0-9]", "", title.lower()) + str(r.randrange(10, 100))
        subscribers = int(10 ** r.uniform(3, 6.3))
        videos = r.randrange(20, 900)
        pool.append(
            FakeChannel(
                index=index,
                id="UC" + b64(digest("id", seed, index), 22),
                topic=topic,
                title=title,
                handle=handle,
                description=f"{r.choice(topic.blurbs)} Hosted by {r.choice(_HOSTS)}. "
                f"New videos every {r.choice(['week', 'Tuesday', 'Friday', 'other week'])}.",
                country=r.choice(_COUNTRIES),
                subscribers=subscribers,
                hidden=r.random() < 0.05,
                videos=videos,
                views=subscribers * r.randrange(20, 200),
                published_at=iso(epoch + timedelta(days=r.randrange(0, 5000))),
            )
        )
    return pool
