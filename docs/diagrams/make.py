"""Draw the docs' two diagrams as SVG, with nothing but the standard library.

    python docs/diagrams/make.py      # rewrites docs/diagrams/*.svg

The SVG files are committed beside this script (their source): the site is built and read
without a network and without a diagram tool. tests/test_docs.py checks they are up to date.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

HERE = Path(__file__).resolve().parent
FONT = "font-family='DejaVu Sans, Helvetica, Arial, sans-serif'"
OURS, REDIS, TEXT, MUTED = "#d95f02", "#7570b3", "#222222", "#666666"


class Svg:
    """A few primitives, enough for a sequence diagram and a box diagram."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.parts: list[str] = []

    def text(
        self,
        x: float,
        y: float,
        text: str,
        *,
        size: int = 13,
        anchor: str = "start",
        color: str = TEXT,
        weight: str = "normal",
        mono: bool = False,
        backed: bool = False,
    ) -> None:
        family = "font-family='DejaVu Sans Mono, Menlo, monospace'" if mono else FONT
        if backed:  # a white ground, so a label reads over the lifelines it crosses
            width = len(text) * size * 0.56
            left = {"start": x, "middle": x - width / 2, "end": x - width}[anchor]
            self.parts.append(
                f"<rect x='{left:.0f}' y='{y - size:.0f}' width='{width:.0f}' "
                f"height='{size + 4}' fill='white'/>"
            )
        self.parts.append(
            f"<text x='{x}' y='{y}' {family} font-size='{size}' text-anchor='{anchor}' "
            f"fill='{color}' font-weight='{weight}'>{escape(text)}</text>"
        )

    def box(self, x: float, y: float, w: float, h: float, color: str, fill: str = "white") -> None:
        self.parts.append(
            f"<rect x='{x}' y='{y}' width='{w}' height='{h}' rx='6' fill='{fill}' "
            f"stroke='{color}' stroke-width='1.5'/>"
        )

    def line(self, x1: float, y1: float, x2: float, y2: float, *, dash: bool = False) -> None:
        style = " stroke-dasharray='4 4'" if dash else ""
        self.parts.append(
            f"<line x1='{x1}' y1='{y1}' x2='{x2}' y2='{y2}' stroke='#999999'{style}/>"
        )

    def arrow(self, x1: float, y1: float, x2: float, color: str = TEXT) -> None:
        """A horizontal message from x1 to x2 at height y1."""
        tip = 8 if x2 > x1 else -8
        self.parts.append(
            f"<line x1='{x1}' y1='{y1}' x2='{x2 - tip}' y2='{y1}' stroke='{color}' "
            "stroke-width='1.5'/>"
            f"<polygon points='{x2},{y1} {x2 - tip},{y1 - 4} {x2 - tip},{y1 + 4}' fill='{color}'/>"
        )

    def render(self) -> str:
        body = "\n".join(self.parts)
        return (
            f"<svg xmlns='http://www.w3.org/2000/svg' width='{self.width}' height='{self.height}' "
            f"viewBox='0 0 {self.width} {self.height}'>\n"
            f"<rect width='100%' height='100%' fill='white'/>\n{body}\n</svg>\n"
        )


def publish_job() -> str:
    """The life of a ``lock_at="publish"`` job, as a sequence diagram."""
    actors = [
        "caller: .delay()",
        "Redis (the lock)",
        "broker",
        "worker: main process",
        "pool child",
    ]
    xs = [90, 290, 470, 640, 830]
    steps: list[tuple[int, int, str, str]] = [
        (0, 1, "acquire.lua: owner = task id, lease = queue lease", OURS),
        (1, 0, "fence (taken) / the holder's id (a duplicate: nothing is sent)", REDIS),
        (0, 2, "the message, header names the lock", TEXT),
        (2, 3, "delivered", TEXT),
        (3, 4, "run it", TEXT),
        (4, 1, "acquire.lua again: same owner re-enters, new run token", OURS),
        (4, 1, "renew.lua every ttl/3 (heartbeat)", OURS),
        (4, 1, "retry: park.lua (kept, unrenewed, countdown + queue lease)", OURS),
        (4, 1, "return or raise: release.lua, all holds, BEFORE the result is stored", OURS),
        (1, 3, "freed: PUBLISH wake-up (a process that waits tries again)", REDIS),
        (3, 1, "child killed: the main process releases (or parks for redelivery)", OURS),
    ]
    top, step = 70, 44
    svg = Svg(960, top + step * (len(steps) + 1))
    svg.text(20, 26, 'The life of a lock_at="publish" job', size=16, weight="bold")
    for name, x in zip(actors, xs, strict=True):
        svg.box(x - 80, 40, 160, 26, MUTED, "#f6f6f6")
        svg.text(x, 58, name, size=12, anchor="middle")
        svg.line(x, 66, x, svg.height - 10, dash=True)
    for i, (a, b, label, color) in enumerate(steps):
        y = top + step * (i + 1)
        svg.arrow(xs[a], y, xs[b], color)
        mid = (xs[a] + xs[b]) / 2
        svg.text(mid, y - 7, label, size=11, anchor="middle", color=color, backed=True)
    return svg.render()


def held_lock() -> str:
    """What one held lock is in Redis: two hashes in one hash tag, and a channel."""
    svg = Svg(960, 330)
    svg.text(
        20, 26, "A held lock in Redis (a publish-mode job while it runs)", size=16, weight="bold"
    )
    svg.box(20, 50, 330, 120, OURS)
    svg.text(35, 75, "lock:{tasks.report:5d41402a…}", mono=True, size=12, weight="bold")
    svg.text(35, 95, "hash   PTTL 27 400 ms (renewed every ttl/3)", size=11, color=MUTED)
    svg.text(35, 122, "3f1c2a9e-8d41-…  →  2", mono=True, size=12)
    svg.text(35, 142, "owner (the task id) → hold count", size=11, color=MUTED)
    svg.text(35, 160, "(its publish's hold + its run's)", size=11, color=MUTED)
    svg.box(380, 50, 560, 210, REDIS)
    svg.text(395, 75, "lock:{tasks.report:5d41402a…}:meta", mono=True, size=12, weight="bold")
    svg.text(
        395,
        95,
        "hash   outlives the lock by a retention (the fence survives)",
        size=11,
        color=MUTED,
    )
    rows = [
        ("fence", "1795664604751993", "larger for every new holder"),
        ("req", "8bdffe16b90a:1", "a resent acquire is not counted twice"),
        ("run", "a91f…", "a redelivery of a live run is refused"),
        ("info", '{"task":…,"state":"running",…}', "what celery locks list shows"),
        ("w", "1795664724751", "waiters may block until then"),
        ("x", "1795664723751", "the meta hash lives until then"),
    ]
    for i, (field, value, why) in enumerate(rows):
        y = 120 + 22 * i
        svg.text(395, y, field, mono=True, size=12)
        svg.text(440, y, value, mono=True, size=12)
        svg.text(700, y, why, size=11, color=MUTED)
    svg.box(20, 200, 330, 60, MUTED, "#f6f6f6")
    svg.text(35, 225, "channel lock:{tasks.report:5d41402a…}:wake", mono=True, size=11)
    svg.text(35, 245, "not a key: subscribed only while a process waits", size=11, color=MUTED)
    svg.text(
        20,
        300,
        "Both keys share the hash tag {…}: one Redis Cluster slot, so every script touches one "
        "slot. A semaphore's permit k adds :s<k> after the tag.",
        size=12,
    )
    return svg.render()


DIAGRAMS = {"publish-job.svg": publish_job, "held-lock.svg": held_lock}


def main() -> None:
    for name, draw in DIAGRAMS.items():
        (HERE / name).write_text(draw(), encoding="utf-8")


if __name__ == "__main__":
    main()
