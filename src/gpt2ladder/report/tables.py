"""Tables for the terminal and for Markdown, shared by every record's report: one row per rung, a
skipped or failed rung as its status and reason."""

from __future__ import annotations


def fmt(value, spec: str, none: str = "-") -> str:
    """`format(value, spec)`, or `none` for a missing value."""
    return none if value is None else format(value, spec)


def rung_rows(rungs: list[dict], cells) -> list[list[str]]:
    """Table rows: `cells(row)` for a measured rung, its status and reason for any other."""
    return [cells(r) if r["status"] == "ok" else [r["name"], f"{r['status']}: {r.get('reason', '')}"]
            for r in rungs]


def text_table(headers: list[str], rows: list[list[str]], right: bool = False) -> str:
    """Aligned columns for the terminal; a row shorter than the headers is a name and a message
    (a skipped or failed rung): its name sets the first column's width, its message no other's."""
    full = [r for r in rows if len(r) == len(headers)]
    widths = [max([len(h)] + [len(r[i]) for r in full]) for i, h in enumerate(headers)]
    widths[0] = max([widths[0]] + [len(r[0]) for r in rows])

    def line(cells):
        return "  ".join(c.rjust(w) if right and i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(headers)] + [line(r) if len(r) == len(headers) else f"{r[0].ljust(widths[0])}  {r[1]}"
                                        for r in rows])


def markdown_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """The same rows as Markdown lines; short rows are padded with empty cells."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return lines + ["| " + " | ".join(r + [""] * (len(headers) - len(r))) + " |" for r in rows]


def signed(value: float, digits: int) -> str:
    """`value` with its sign and `digits` decimals, a difference that rounds to zero as +0.000 (never -0.000)."""
    text = f"{value:+.{digits}f}"
    return f"{0:+.{digits}f}" if float(text) == 0 else text
