"""A machine config drawn as inline SVG, for pages that must render with no script and no network (the
HTML report of a round); the same picture `describe_mermaid` gives GitHub, laid out here in Python.

The layout is deliberately simple: states in layers by their distance from the initial state (states
no path reaches go last), in document order within a layer; a transition to a later layer is a
straight arrow, any other (back, sideways, to itself) a curve out to the side. Edge labels are the
event and the guard, shortened as in the Mermaid diagram. All text is HTML-escaped.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from html import escape

from improve.machine.config import MachineConfig
from improve.machine.describe import MERMAID_GUARD_MAX, checked_in_turn, edge_text
from improve.machine.walk import edges

__all__ = ["describe_svg"]

_BOX_H, _LAYER_GAP, _BOX_GAP, _MARGIN, _CHAR_W, _LABEL_W = 34, 120, 28, 24, 7.2, 6.0


@dataclass
class _Box:
    name: str
    layer: int
    x: float = 0.0
    y: float = 0.0
    w: float = 0.0
    slot: float = 0.0
    """The width the box takes in its layer: its own, or that of the widest label arriving at it."""
    arriving: int = 0

    @property
    def cx(self) -> float:
        return self.x + self.w / 2


def _layers(config: MachineConfig) -> dict[str, int]:
    depth = {config.initial: 0} if config.initial in config.states else {}
    frontier = list(depth)
    while frontier:
        following = []
        for name in frontier:
            for edge in edges(name, config.states[name]):
                if edge.target is not None and edge.target in config.states and edge.target not in depth:
                    depth[edge.target] = depth[name] + 1
                    following.append(edge.target)
        frontier = following
    last = max(depth.values(), default=-1) + 1
    return {name: depth.get(name, last) for name in config.states}


def describe_svg(config: MachineConfig, highlight: Collection[str] = ()) -> str:
    """The machine as an `<svg>` element: sentinel finals red, states in `highlight` amber, finals with a
    double border, the initial state marked by a filled dot."""
    layer_of = _layers(config)
    boxes = {name: _Box(name, layer) for name, layer in layer_of.items()}
    rows: dict[int, list[_Box]] = {}
    for box in boxes.values():
        box.w = box.slot = max(90.0, len(box.name) * _CHAR_W + 28)
        rows.setdefault(box.layer, []).append(box)
    # A forward edge's label sits just above its target, so each target is given room for its labels.
    for name, state in config.states.items():
        for edge, order in checked_in_turn(name, state):
            dst = boxes.get(edge.target) if edge.target is not None else None
            if dst is not None and dst.layer > boxes[name].layer:
                dst.slot = max(dst.slot, len(edge_text(edge, MERMAID_GUARD_MAX, order)) * _LABEL_W + 12)
    widths = {layer: sum(b.slot for b in row) + _BOX_GAP * (len(row) - 1) for layer, row in rows.items()}
    width = max(widths.values(), default=200.0) + 2 * _MARGIN + 160  # room for side curves and labels
    for layer, row in rows.items():
        x = (width - widths[layer]) / 2
        for box in row:
            box.x, box.y = x + (box.slot - box.w) / 2, _MARGIN + 30 + layer * _LAYER_GAP
            x += box.slot + _BOX_GAP
    height = _MARGIN * 2 + 30 + max(rows, default=0) * _LAYER_GAP + _BOX_H
    sentinels, changed = set(config.sentinels()), set(highlight)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" '
        f'height="{height:.0f}" role="img" aria-label="{escape(config.id)} state diagram" class="machine">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#444"/></marker></defs>',
    ]
    labels: list[str] = []
    for name, state in config.states.items():
        src = boxes[name]
        for n, (edge, order) in enumerate(checked_in_turn(name, state)):
            dst = boxes.get(edge.target) if edge.target is not None else src
            if dst is None:
                continue  # a dangling target: validation reports it; the diagram cannot draw it
            text = escape(edge_text(edge, MERMAID_GUARD_MAX, order))
            if dst.layer > src.layer:
                x1, y1, x2, y2 = src.cx, src.y + _BOX_H, dst.cx, dst.y
                parts.append(
                    f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" class="edge" '
                    'marker-end="url(#arrow)"/>'
                )
                # Just above the target, in the room its slot was given; several arrivals stack up.
                lx, ly = dst.cx, dst.y - 8 - 14 * dst.arriving
                dst.arriving += 1
            else:
                # Back, sideways or to itself: out of the right side and round.
                bend = 40 + 14 * n
                x1, y1 = src.x + src.w, src.y + _BOX_H / 2 - 6
                x2, y2 = dst.x + dst.w, dst.y + _BOX_H / 2 + 6
                parts.append(
                    f'<path d="M{x1:.1f},{y1:.1f} C{x1 + bend:.1f},{y1:.1f} {x2 + bend:.1f},{y2:.1f} '
                    f'{x2:.1f},{y2:.1f}" class="edge" fill="none" marker-end="url(#arrow)"/>'
                )
                lx, ly = max(x1, x2) + bend * 0.75, (y1 + y2) / 2
            anchor = "middle" if dst.layer > src.layer else "start"
            labels.append(
                f'<text x="{lx:.1f}" y="{ly:.1f}" text-anchor="{anchor}" class="edge-label">{text}</text>'
            )
    for name, box in boxes.items():
        state = config.states[name]
        kind = "sentinel" if name in sentinels else "changed" if name in changed else "state"
        shape = "choice" if state.type == "choice" else "box"
        parts.append(
            f'<rect x="{box.x:.1f}" y="{box.y:.1f}" width="{box.w:.1f}" height="{_BOX_H}" rx="8" '
            f'class="{kind} {shape}"><title>{escape(state.description or name)}</title></rect>'
        )
        if state.is_final:
            parts.append(
                f'<rect x="{box.x + 3:.1f}" y="{box.y + 3:.1f}" width="{box.w - 6:.1f}" height="{_BOX_H - 6}" '
                'rx="6" class="final-ring" fill="none"/>'
            )
        parts.append(
            f'<text x="{box.cx:.1f}" y="{box.y + _BOX_H / 2 + 5:.1f}" text-anchor="middle" class="state-name">'
            f"{escape(name)}</text>"
        )
        if name == config.initial:
            parts.append(
                f'<circle cx="{box.cx:.1f}" cy="{box.y - 22:.1f}" r="6" fill="#111"/><line x1="{box.cx:.1f}" '
                f'y1="{box.y - 16:.1f}" x2="{box.cx:.1f}" y2="{box.y:.1f}" class="edge" marker-end="url(#arrow)"/>'
            )
    parts += labels  # drawn last, over the lines
    parts.append("</svg>")
    return "\n".join(parts)
