"""Chart geometry for the dashboard's server-side SVG: scales, ticks and shapes as plain
numbers, which the templates (``templates/charts.html``) turn into SVG elements. No
script draws anything in the browser, and every label goes through the templates'
escaping."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    width: float
    height: float
    css: str  # the class that colours it (dashboard.css)
    title: str  # shown on hover (an SVG <title>)
    href: str | None = None


@dataclass(frozen=True)
class Tick:
    pos: float
    label: str
    anchor: str = "middle"  # SVG text-anchor: the first and last labels stay inside


@dataclass(frozen=True)
class Chart:
    """An SVG chart: its size, the plot area's origin and size, shapes and axes."""

    width: float
    height: float
    left: float
    top: float
    plot_width: float
    plot_height: float
    rects: list[Rect] = field(default_factory=list)
    x_ticks: list[Tick] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)
    legend: list[tuple[str, str]] = field(default_factory=list)  # (css, label)
    y_label: str = ""

    @property
    def bottom(self) -> float:
        return self.top + self.plot_height


def nice_step(value: float, n: int = 4) -> float:
    """A round tick step (1, 2, 2.5 or 5 times a power of ten) such that ``n`` steps
    reach at least ``value`` (1 for 0)."""
    if value <= 0:
        return 1.0
    raw = value / n
    power = 10.0 ** math.floor(math.log10(raw))
    for step in (1.0, 2.0, 2.5, 5.0):
        if step * power >= raw:
            return step * power
    return 10.0 * power


# Round steps for a time axis, in seconds: 1 s up to a day.
_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800,
               21600, 43200, 86400)


def nice_time_step(seconds: float, n: int = 4) -> float:
    """A round step of time (seconds, minutes or hours) such that ``n`` steps reach at
    least ``seconds``; below a second, :func:`nice_step`; above a day, whole days."""
    raw = seconds / n
    if raw <= 0.5:
        return nice_step(seconds, n)
    for step in _TIME_STEPS:
        if step >= raw:
            return float(step)
    return 86400.0 * math.ceil(raw / 86400)


def y_ticks(step: float, top: float, height: float, n: int = 4,
            fmt: Callable[[float], str] | None = None) -> list[Tick]:
    def plain(v: float) -> str:
        return f"{v:,.0f}" if v == int(v) else f"{v:,.1f}"

    label = fmt or plain
    return [Tick(top + height - height * i / n, label(step * i)) for i in range(n + 1)]


def stacked_minutes(done: Sequence[int], failed: Sequence[int], *, width: float = 1050,
                    height: float = 220) -> Chart:
    """Done and failed jobs per minute over the last hour, stacked bars (failed on
    top), oldest minute on the left."""
    left, top, right, bottom = 48.0, 12.0, 8.0, 28.0
    pw, ph = width - left - right, height - top - bottom
    n = len(done)
    step = nice_step(max((d + f for d, f in zip(done, failed, strict=True)), default=0))
    peak = step * 4
    slot = pw / max(n, 1)
    rects: list[Rect] = []
    for i, (d, f) in enumerate(zip(done, failed, strict=True)):
        x = left + i * slot + slot * 0.12
        ago = n - 1 - i
        when = "the last minute" if ago == 0 else f"{ago + 1} to {ago} minutes ago"
        hd, hf = ph * d / peak, ph * f / peak
        if d:
            rects.append(Rect(x, top + ph - hd, slot * 0.76, hd, "done",
                              f"{d:,} done, {when}"))
        if f:
            rects.append(Rect(x, top + ph - hd - hf, slot * 0.76, hf, "failed",
                              f"{f:,} failed, {when}"))
    x_ticks = [Tick(left + (n - m) * slot, "now" if m == 0 else f"-{m} min",
                    "end" if m == 0 else "middle") for m in range(0, n + 1, 10)]
    return Chart(width, height, left, top, pw, ph, rects, x_ticks,
                 y_ticks(step, top, ph), [("done", "done"), ("failed", "failed")],
                 "jobs / minute")


def grouped_bars(categories: Sequence[str], series: Sequence[tuple[str, str, Sequence[float]]],
                 *, width: float = 1050, height: float = 240) -> Chart:
    """Bars grouped by category, one bar per series (css, label, values in seconds)."""
    left, top, right, bottom = 56.0, 12.0, 8.0, 28.0
    pw, ph = width - left - right, height - top - bottom
    step = nice_time_step(max((v for _, _, vs in series for v in vs), default=0))
    peak = step * 4
    slot = pw / max(len(categories), 1)
    bar = min(slot * 0.8 / max(len(series), 1), 90)
    rects: list[Rect] = []
    for i, cat in enumerate(categories):
        x0 = left + i * slot + (slot - bar * len(series)) / 2
        for k, (css, label, values) in enumerate(series):
            h = ph * values[i] / peak
            rects.append(Rect(x0 + k * bar + 1, top + ph - h, bar - 2, h, css,
                              f"{cat}: {label} {duration(values[i])}"))
    x_ticks = [Tick(left + (i + 0.5) * slot, c) for i, c in enumerate(categories)]
    return Chart(width, height, left, top, pw, ph, rects, x_ticks,
                 y_ticks(step, top, ph, fmt=duration),
                 [(css, label) for css, label, _ in series], "wait")


def timeline(runs: Sequence[dict[str, object]], now: datetime, *, width: float = 1050,
             lane_height: float = 18, href: str = "") -> Chart:
    """Runs as bars over time, coloured by stop reason (``running`` while unfinished);
    runs that overlap in time go to separate lanes."""
    left, top, right, bottom = 8.0, 8.0, 8.0, 26.0
    pw = width - left - right
    spans = []
    for r in runs:
        start = r["started_at"]
        end = r["finished_at"] or now
        assert isinstance(start, datetime) and isinstance(end, datetime)
        spans.append((start, max(end, start), r))
    if not spans:
        return Chart(width, top + bottom + lane_height, left, top, pw, lane_height)
    t0 = min(s for s, _, _ in spans)
    t1 = max(e for _, e, _ in spans)
    total = max((t1 - t0).total_seconds(), 1.0)
    lanes: list[datetime] = []  # each lane's end
    rects: list[Rect] = []
    for start, end, r in sorted(spans, key=lambda s: (s[0], str(s[2]["id"]))):
        lane = next((i for i, e in enumerate(lanes) if e <= start), None)
        if lane is None:
            lane = len(lanes)
            lanes.append(end)
        else:
            lanes[lane] = end
        x = left + pw * (start - t0).total_seconds() / total
        w = max(pw * (end - start).total_seconds() / total, 2.0)
        reason = str(r["stop_reason"] or "running")
        rects.append(Rect(x, top + lane * lane_height, w, lane_height - 4, reason,
                          f"{reason}: {start:%Y-%m-%d %H:%M:%S} UTC, "
                          f"{duration((end - start).total_seconds())}",
                          f"{href}#run-{r['id']}"))
    ph = len(lanes) * lane_height
    fmt = "%H:%M:%S" if t0.date() == t1.date() else "%m-%d %H:%M"
    x_ticks = [Tick(left + pw * i / 4, f"{t0 + timedelta(seconds=total * i / 4):{fmt}}",
                    ("start", "middle", "middle", "middle", "end")[i]) for i in range(5)]
    return Chart(width, top + ph + bottom, left, top, pw, ph, rects, x_ticks)


def duration(seconds: float | None) -> str:
    """A short human duration: ``850 ms``, ``42.0 s``, ``3m 05s``, ``2h 03m``,
    ``3d 04h``."""
    if seconds is None:
        return "—"
    s = max(float(seconds), 0.0)
    if s == 0:
        return "0 s"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.0f} s" if s == int(s) else f"{s:.1f} s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m {sec:02d}s" if sec else f"{m} min"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h {m:02d}m" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d}d {h:02d}h" if h else f"{d} d"


__all__ = ["Chart", "Rect", "Tick", "duration", "grouped_bars", "nice_step", "nice_time_step",
           "stacked_minutes", "timeline"]
