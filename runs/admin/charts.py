"""The dashboard's charts, drawn on the server as inline SVG (docs/design/operations.md#dashboard):
no chart library, no script, nothing fetched. Colours come from CSS classes
(runs/static/runs/admin.css) on the admin's own variables, so the charts follow its light and dark
themes; a `viewBox` lets them shrink to a phone's width. Each bar carries `data-label`/`data-value`
and a `<title>`: what a test reads, what a pointer shows.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

# Narrow enough that, scaled down to a phone's width, the text stays legible.
WIDTH = 460
ROW = 26
LABEL_WIDTH = 90
VALUE_WIDTH = 50
PLOT_HEIGHT = 120
AXIS = 18
LEFT = 40  # the y axis' labels
TOP = 14  # room for a value above the tallest bar


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    # The figure as written on the chart (the value may be a rate).
    text: str = ""
    css: str = ""


def _number(value: float) -> str:
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:,.2f}" if value < 10 else f"{value:,.1f}"


def _at(coordinate: float) -> str:
    # format_html escapes its arguments into strings first: numbers are formatted here.
    return f"{coordinate:.1f}"


def _svg(name: str, title: str, height: int, body: SafeString) -> SafeString:
    return format_html(
        '<svg class="rl-chart" data-chart="{}" viewBox="0 0 {} {}" role="img" aria-label="{}"'
        ' preserveAspectRatio="xMinYMin meet"><title>{}</title>{}</svg>',
        name,
        WIDTH,
        height,
        title,
        title,
        body,
    )


def _bar_rect(bar: Bar, x: float, y: float, width: float, height: float, tooltip: str) -> SafeString:
    return format_html(
        '<rect class="rl-bar {}" data-label="{}" data-value="{}" x="{}" y="{}" width="{}" height="{}">'
        "<title>{}</title></rect>",
        bar.css,
        bar.label,
        repr(float(bar.value)),
        _at(x),
        _at(y),
        _at(max(width, 0.0)),
        _at(max(height, 0.0)),
        tooltip,
    )


def horizontal_bars(name: str, title: str, bars: Sequence[Bar]) -> SafeString:
    """One labelled bar per row, scaled to the largest: counts by status."""
    top = max([bar.value for bar in bars] + [1])
    span = WIDTH - LABEL_WIDTH - VALUE_WIDTH
    rows = []
    for i, bar in enumerate(bars):
        y = i * ROW
        text = bar.text or _number(bar.value)
        rows.append(
            format_html(
                '<text class="rl-chart-label" x="0" y="{}">{}</text>{}'
                '<text class="rl-chart-value" x="{}" y="{}">{}</text>',
                _at(y + 17),
                bar.label,
                _bar_rect(bar, LABEL_WIDTH, y + 4, span * bar.value / top, ROW - 8, f"{bar.label}: {text}"),
                _at(LABEL_WIDTH + span * bar.value / top + 6),
                _at(y + 17),
                text,
            )
        )
    return _svg(name, title, max(len(bars), 1) * ROW, mark_safe("".join(rows)))


def vertical_bars(
    name: str, title: str, bars: Sequence[Bar], *, first: str, last: str, values: bool = False
) -> SafeString:
    """Bars side by side over a y axis from 0 to the largest, the x axis labelled at its two ends:
    a rate per minute over the hour, a histogram (with `values`: each count above its bar)."""
    top = max([bar.value for bar in bars] + [0])
    scale = (PLOT_HEIGHT - TOP) / top if top else 0.0
    step = (WIDTH - LEFT) / max(len(bars), 1)
    gap = min(2.0, step / 4)
    rects = format_html_join(
        "",
        "{}",
        (
            (
                _bar_rect(
                    bar,
                    LEFT + i * step + gap / 2,
                    PLOT_HEIGHT - bar.value * scale,
                    step - gap,
                    bar.value * scale,
                    f"{bar.label}: {bar.text or _number(bar.value)}",
                ),
            )
            for i, bar in enumerate(bars)
        ),
    )
    axes = format_html(
        '<line class="rl-chart-axis" x1="{l}" y1="{h}" x2="{w}" y2="{h}"/>'
        '<line class="rl-chart-grid" x1="{l}" y1="{g}" x2="{w}" y2="{g}"/>'
        '<text class="rl-chart-tick" x="{t}" y="{g4}" text-anchor="end">{top}</text>'
        '<text class="rl-chart-tick" x="{t}" y="{h}" text-anchor="end">0</text>'
        '<text class="rl-chart-tick" x="{l}" y="{b}">{first}</text>'
        '<text class="rl-chart-tick" x="{w}" y="{b}" text-anchor="end">{last}</text>',
        l=LEFT,
        g=TOP + 0.5,
        g4=TOP + 4,
        w=WIDTH,
        h=PLOT_HEIGHT,
        t=LEFT - 4,
        b=PLOT_HEIGHT + AXIS - 4,
        top=_number(top),
        first=first,
        last=last,
    )
    counts = format_html_join(
        "",
        '<text class="rl-chart-tick" x="{}" y="{}" text-anchor="middle">{}</text>',
        (
            (_at(LEFT + (i + 0.5) * step), _at(PLOT_HEIGHT - bar.value * scale - 3), _number(bar.value))
            for i, bar in enumerate(bars)
            if values and bar.value
        ),
    )
    return _svg(name, title, PLOT_HEIGHT + AXIS, format_html("{}{}{}", axes, rects, counts))
