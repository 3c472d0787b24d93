"""The drawn boxes of a figure's words, for tests that no two of them overlap."""

from __future__ import annotations

from matplotlib.text import Text


def text_boxes(fig) -> list[tuple[str, object, bool]]:
    """(text, display box, is a tick label) of every visible, non-empty text of the figure, of each legend
    as a whole and of the axis lines (spines) a label could run into."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes, inside_legends, ticks = [], set(), set()
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is not None:
            boxes.append(("legend", legend.get_window_extent(renderer), False))
            inside_legends.update(legend.get_texts())
        ticks.update(ax.get_xticklabels() + ax.get_yticklabels())
        boxes += [(f"{side} spine", spine.get_window_extent(renderer), False) for side, spine in ax.spines.items()
                  if spine.get_visible()]
    for text in fig.findobj(Text):
        if text in inside_legends or not text.get_visible() or not text.get_text().strip():
            continue
        boxes.append((text.get_text(), text.get_window_extent(renderer), text in ticks))
    return boxes


def overlaps(fig) -> list[tuple[str, str]]:
    """Every pair of boxes that intersect. Not counted: two spines meeting at a corner, and two tick labels
    (matplotlib spaces those, and a rotated label's upright box is wider than its letters)."""
    boxes = text_boxes(fig)
    found = []
    for i, (a, box_a, tick_a) in enumerate(boxes):
        for b, box_b, tick_b in boxes[i + 1:]:
            if (a.endswith(" spine") and b.endswith(" spine")) or (tick_a and tick_b):
                continue
            if box_a.overlaps(box_b):
                found.append((a, b))
    return found
