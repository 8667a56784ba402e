"""The period strip drawn as inline SVG on the server: no script, legible without colour (each
state has its own shape and letter), every text escaped. Written as plain string building,
not a template loop: a page of strips is thousands of cells."""

from __future__ import annotations

import re
from functools import lru_cache

from markupsafe import Markup, escape

from cronkeeper.web.strip import LETTER, CellState, Strip

W, GAP, H = 14, 2, 22


def _shape(state: CellState, x: int) -> str:
    cx = x + W // 2
    if state is CellState.EMITTED:
        return f'<rect class="box" x="{x}" y="2" width="{W}" height="{H - 4}" rx="2"/>'
    if state is CellState.SKIPPED:  # a lower, hollow bar
        return f'<rect class="box" x="{x + 1}" y="8" width="{W - 2}" height="{H - 10}"/>'
    if state is CellState.MISSING:  # a pennant: square shoulders, pointed foot
        return (f'<path class="box" d="M{x} 1 L{x + W} 1 L{x + W} {H - 6} L{cx} {H - 1} '
                f'L{x} {H - 6} Z"/>')
    if state is CellState.DEAD:  # a square with a cross
        return (f'<rect class="box" x="{x}" y="2" width="{W}" height="{H - 4}"/>'
                f'<path class="cross" d="M{x + 2} 4 L{x + W - 2} {H - 4} M{x + W - 2} 4 '
                f'L{x + 2} {H - 4}"/>')
    if state is CellState.RUNNING:
        return f'<circle class="box" cx="{cx}" cy="{H // 2}" r="{W // 2}"/>'
    return f'<rect class="box" x="{x + 1}" y="3" width="{W - 2}" height="{H - 6}" rx="2"/>'


@lru_cache(maxsize=4096)
def _drawing(state: CellState, i: int) -> str:
    """The shape and letter of the i-th cell: a few hundred distinct strings, drawn once."""
    x = i * (W + GAP)
    return f'{_shape(state, x)}<text x="{x + W // 2}" y="{H - 7}">{LETTER[state]}</text></g>'


# Characters that markup would read; a text without them is its own escape. A cell's texts
# (ISO instants, local times, reasons and job states from checked columns) never hold one, so
# escaping each through ``markupsafe`` (two calls and a Markup object per cell) is skipped.
_MARKUP = re.compile(r"[&<>\"']").search


def _text(value: str) -> str:
    return str(escape(value)) if _MARKUP(value) else value


@lru_cache(maxsize=64)
def _opening(state: CellState, waiting: bool) -> str:
    value = state.value
    return (f'<g class="cell s-{value}{" waiting" if waiting else ""}" data-state="{value}" '
            'data-at="')


def strip_svg(strip: Strip) -> Markup:
    n = len(strip.cells)
    if n == 0:
        return Markup('<span class="muted strip-empty">no period due yet</span>')
    width = max(n * (W + GAP), W + GAP)
    out = [f'<svg class="strip" xmlns="http://www.w3.org/2000/svg" role="img" '
           f'aria-label="{escape(strip.label())}" width="{width}" height="{H}" '
           f'viewBox="0 0 {width} {H}">']
    emitted = CellState.EMITTED
    for i, cell in enumerate(strip.cells):
        state = cell.state
        out.append(
            f'{_opening(state, state is emitted and cell.job_state == "available")}'
            f'{_text(cell.scheduled_for)}"><title>{_text(cell.title)}</title>'
            f'{_drawing(state, i)}'
        )
    for mark in strip.marks:
        x = mark.before * (W + GAP) - GAP // 2
        at = mark.active_from.strftime("%Y-%m-%d %H:%M:%SZ")
        out.append(
            f'<g class="vmark" data-version="{mark.version_id}"><title>schedule changed: version '
            f'{mark.version_id} in force from {at}</title>'
            f'<line x1="{x}" y1="0" x2="{x}" y2="{H}"/></g>'
        )
    out.append("</svg>")
    return Markup("".join(out))
