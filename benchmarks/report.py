"""What ``make demo`` prints and draws from the benchmark rows: a plain table whose every case sits on one line
within 100 columns, one paragraph per op in words, and one picture (matplotlib) of each row's share of the
machine limit and its speed-up over the anchor.

The rows are ``harness.BenchRow`` objects and the limits a ``harness.MachineLimits``; this module only reads
them (their efficiency methods), so it imports nothing from the harness.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Sequence

WIDTH = 100  # columns of the demo's output
TOLERANCE = 3e-3  # diff1, diff2 bound of the accumulating ops
# Anchors whose own result is not reproducible in some setting, and why (shown instead of a mismatch).
NONDETERMINISTIC_ANCHORS = {
    "spconv": "spconv's CPU convolutions are not thread-safe, so their result changes with the thread count "
              "({threads} threads here), while cvops's sparse convolutions give the same bits on any count. "
              "bench_sparse_conv.py --threads 1 compares the two exactly.",
}
CACHE_NOTE = ("* above 100%: faster than moving every input and output byte (the MLU-OPS theory IO) at the "
              "measured copy bandwidth: the op touches fewer bytes than that count (psamask's forward reads, at each "
              "position, only the mask channels whose window lies inside the map: 2,401 of 9,409 at PSANet's 49 x "
              "49), or its data stayed in the CPU caches, which are faster than the main memory a copy measures.")


@dataclass
class Verdict:
    kind: str      # "exact", "close", "same", "anchor-nondeterministic", "mismatch" or "unchecked"
    short: str     # a table cell
    worst: float = 0.0


def _diffs(check: str) -> list[float]:
    values = []
    for part in check.replace(" ", ",").split(","):
        if "=" in part:
            try:
                values.append(float(part.split("=", 1)[1]))
            except ValueError:
                pass
    return values


def verdict(row, limits) -> Verdict:
    """Reads a benchmark's ``check`` string: ``exact``, ``diff1=..[,dx=..]``, ``pairs=spconv``, ``MISMATCH``...
    Differences that are all zero are bit-exact results, not results within the tolerance."""
    check = row.check.strip()
    if not check:
        return Verdict("unchecked", "not checked")
    if check == "exact":
        return Verdict("exact", "bit-exact")
    if check.startswith("pairs="):
        return Verdict("same", "same pairs")  # the kernel map of the anchor named in the row
    diffs = _diffs(check)
    if diffs and "FAIL" not in check:
        worst = max(diffs)
        if worst == 0:
            return Verdict("exact", "bit-exact")
        if worst <= TOLERANCE:
            return Verdict("close", f"diff {worst:.0e}", worst)
        anchor = next((a for a in NONDETERMINISTIC_ANCHORS if row.anchor.startswith(a)), None)
        if anchor and limits.threads > 1:
            return Verdict("anchor-nondeterministic", f"{anchor} varies", worst)
        return Verdict("mismatch", "MISMATCH", worst)
    return Verdict("mismatch", "MISMATCH")


def speed(row, limits) -> tuple[str, float]:
    """The limit an op is judged against: the copy bandwidth for pure IO, the roofline when it computes."""
    if row.flops:
        return "roofline", row.roofline_efficiency(limits)
    return "bandwidth", row.io_efficiency(limits)


def _span(values, fmt, unit: str = "") -> str:
    lo, hi = fmt(min(values)), fmt(max(values))
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def _times(ratio: float) -> str:
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.2g}x"


def duration(seconds: float) -> str:
    """``0.23 ms``, ``12.3 ms``, ``2.19 s``: three significant digits in the unit a reader takes in at once."""
    if seconds >= 1:
        return f"{seconds:.3g} s"
    ms = seconds * 1e3
    return f"{ms:.3g} ms" if ms < 100 else f"{ms:.0f} ms"


def _duration_span(values: Sequence[float]) -> str:
    """``4.12-12.3 ms`` or ``0.81-2.19 s``: both ends in the unit of the larger."""
    lo, hi = min(values), max(values)
    if hi >= 1:
        ends, unit = [f"{v:.3g}" for v in (lo, hi)], "s"
    else:
        ends, unit = [f"{v * 1e3:.3g}" if v < 0.1 else f"{v * 1e3:.0f}" for v in (lo, hi)], "ms"
    return f"{ends[0]} {unit}" if ends[0] == ends[1] else f"{ends[0]}-{ends[1]} {unit}"


def _ratio_words(name: str, ratios: list[float]) -> str:
    if min(ratios) >= 1:
        return f"{_span(ratios, lambda v: _times(v)[:-1], 'x')} faster than {name}."
    if max(ratios) < 1:
        return f"{_span([1 / r for r in ratios], lambda v: _times(v)[:-1], 'x')} slower than {name}."
    return f"from {_times(1 / min(ratios))} slower to {_times(max(ratios))} faster than {name}, by case."


def summarize(rows: Sequence, limits) -> list[tuple[str, str]]:
    """One ``(op, sentence)`` per op: did it match, how close to the machine's limit, against the anchor."""
    ops: dict[str, list] = {}
    for r in rows:
        ops.setdefault(r.op, []).append(r)
    lines = []
    for op, group in ops.items():
        verdicts = [verdict(r, limits) for r in group]
        kinds = {v.kind for v in verdicts}
        checked = [v for v in verdicts if v.kind != "unchecked"]
        if "mismatch" in kinds:
            bad = [f"{r.case} {r.direction}" for r, v in zip(group, verdicts) if v.kind == "mismatch"]
            words = f"DID NOT MATCH its reference in {len(bad)} of {len(group)} runs ({', '.join(bad)})."
        elif not checked:
            words = "Not compared in this run (no reference or anchor for these cases)."
        elif not kinds & {"close", "anchor-nondeterministic"}:
            runs = f"all {len(checked)} compared runs" if len(checked) > 1 else "the compared run"
            anchor = next((r.anchor for r in group if r.anchor), "") or "the anchor"
            what = {frozenset({"exact"}): "Bit-exact", frozenset({"same"}): f"The same result as {anchor}"}.get(
                frozenset(kinds - {"unchecked"}), f"Bit-exact or the same result as {anchor}")
            words = (f"{what} in {runs}"
                     + ("" if len(checked) == len(group) else f" ({len(group) - len(checked)} timed only)") + ".")
        else:
            close = [v.worst for v in checked if v.kind == "close"]
            words = (f"Matched within the {TOLERANCE:g} tolerance (largest difference {max(close):.1e})."
                     if close else "")
            if "anchor-nondeterministic" in kinds:
                row = next(r for r, v in zip(group, verdicts) if v.kind == "anchor-nondeterministic")
                worst = max(v.worst for v in checked if v.kind == "anchor-nondeterministic")
                name = next(a for a in NONDETERMINISTIC_ANCHORS if row.anchor.startswith(a))
                words += (f" Differs from {row.anchor} by {worst:.1e}, which is the anchor's own variation, "
                          f"not an error: " + NONDETERMINISTIC_ANCHORS[name].format(threads=limits.threads))
        limit, _ = speed(group[0], limits)
        effs = [speed(r, limits)[1] for r in group]
        what = "of the copy bandwidth" if limit == "bandwidth" else "of the roofline bound"
        cached = " (over 100%: see * under the table)" if max(effs) > 1 else ""
        words += (f" Ran at {_span(effs, lambda v: f'{100 * v:.0f}', '%')} {what}{cached}, "
                  f"{_duration_span([r.seconds for r in group])} per call.")
        anchored: dict[str, list[float]] = {}
        for r in group:
            if r.anchor_seconds:
                anchored.setdefault(r.anchor, []).append(r.anchor_seconds / r.seconds)
        for name, ratios in anchored.items():
            words += " " + _ratio_words(name, ratios)
        if not anchored:
            words += " No anchor timed in this run."
        lines.append((op, words.strip()))
    return lines


HEADERS = ("op", "case", "dir", "result", "per call", "of limit", "vs anchor")
RIGHT = {"per call", "of limit", "vs anchor"}
DIRECTIONS = {"forward": "fwd", "backward": "bwd", "fwd+bwd": "step"}


def table_cells(rows: Sequence, limits) -> list[list[str]]:
    """One list of cells per row, in the order of :data:`HEADERS`."""
    body = []
    for r in rows:
        limit, eff = speed(r, limits)
        mark = "*" if eff > 1 else " "
        ratio = _times(r.anchor_seconds / r.seconds) if r.anchor_seconds else "-"
        direction = DIRECTIONS.get(r.direction, r.direction)
        body.append([r.op, r.case, direction, verdict(r, limits).short, duration(r.seconds),
                     f"{100 * eff:.0f}% {'BW' if limit == 'bandwidth' else 'roof'}{mark}", ratio])
    return body


def format_table(rows: Sequence, limits, width: int = WIDTH) -> list[str]:
    """The table as text lines: each column as wide as its longest cell, so that no case name breaks; two
    spaces between columns, one where two would pass ``width``; where even one would, the result column's
    longest words are cut (ending in "~")."""
    body = table_cells(rows, limits)
    widths = [max(len(cells[i]) for cells in [list(HEADERS)] + body) for i in range(len(HEADERS))]
    gap = "  " if sum(widths) + 2 * (len(widths) - 1) <= width else " "
    over = sum(widths) + len(gap) * (len(widths) - 1) - width
    result = HEADERS.index("result")
    if over > 0:
        widths[result] = max(len(HEADERS[result]), widths[result] - over)
        for cells in body:
            if len(cells[result]) > widths[result]:
                cells[result] = cells[result][:widths[result] - 1] + "~"

    def line(cells):
        return gap.join(c.rjust(w) if h in RIGHT else c.ljust(w) for c, w, h in zip(cells, widths, HEADERS)).rstrip()

    return [line(HEADERS), line(["-" * w for w in widths])] + [line(cells) for cells in body]


def legend(rows: Sequence, limits, width: int = WIDTH) -> list[str]:
    text = ("dir: fwd (forward), bwd (backward) or step (forward and backward of a training step). of limit: the "
            "share of the copy bandwidth (BW) measured in this run or, for ops that compute, of the roofline bound "
            "(roof: the larger of IO / bandwidth and FLOPs / measured matmul rate). vs anchor: anchor time / cvops "
            "time (>1: cvops faster); the anchors are named below.")
    lines = textwrap.wrap(text, width)
    if any(speed(r, limits)[1] > 1 for r in rows):
        lines += textwrap.wrap(CACHE_NOTE, width)
    return lines


def print_demo(rows: Sequence, limits, title: str, load_line: str = "", width: int = WIDTH, file=None) -> None:
    """The demo's output: the title, the table, its legend, the machine and its load, one paragraph per op."""
    out = [title, ""] + format_table(rows, limits, width) + [""] + legend(rows, limits, width) + [""]
    out += textwrap.wrap(limits.describe(), width)
    if load_line:
        out += textwrap.wrap(load_line, width)
    for op, words in summarize(rows, limits):
        out += [""] + textwrap.wrap(f"{op}: {words}", width, subsequent_indent="    ")
    print("\n".join(out), file=file, flush=True)


def plot_speed(rows: Sequence, limits, path, title: str, notes: Sequence[str] = ()) -> bool:
    """One horizontal bar per op, case and direction in two panels: the share of the machine limit (copy
    bandwidth, or the roofline for ops that compute) and the speed-up over the anchor (log scale). The title
    and ``notes`` wrap to the figure's width. Needs matplotlib (the ``bench`` extra); False without it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [f"{r.op}  {r.case}  {r.direction}" for r in rows]
    shares = [100 * speed(r, limits)[1] for r in rows]
    ypos = list(range(len(rows)))[::-1]
    colours = plt.cm.tab10.colors
    op_colour = {op: colours[i % len(colours)] for i, op in enumerate(dict.fromkeys(r.op for r in rows))}
    fig, (left, right) = plt.subplots(1, 2, sharey=True, figsize=(13, 0.32 * len(rows) + 2.4),
                                      gridspec_kw={"width_ratios": [3, 2]})
    left.barh(ypos, shares, color=[op_colour[r.op] for r in rows])
    for y, share, r in zip(ypos, shares, rows):
        kind = "BW" if speed(r, limits)[0] == "bandwidth" else "roof"
        left.text(share, y, f" {share:.0f}% {kind}", va="center", fontsize=7)
    left.axvline(100, color="grey", linewidth=0.8, linestyle="--")
    left.set_xlim(0, max(110, 1.2 * max(shares, default=0)))
    left.set_yticks(ypos, labels, fontsize=7)
    left.set_title("share of the machine limit", fontsize=9)
    left.set_xlabel(f"% of the copy bandwidth, {limits.bandwidth / 1e9:.1f} GB/s (BW), or of the roofline\n"
                    f"with {limits.matmul_flops / 1e9:.0f} GFLOP/s of fp32 matmul (roof), measured in this run",
                    fontsize=8)
    ratios = [r.anchor_seconds / r.seconds if r.anchor_seconds else None for r in rows]
    for y, ratio, r in zip(ypos, ratios, rows):
        if ratio is None:
            right.text(1, y, " no anchor", va="center", fontsize=7, color="grey")
            continue
        right.barh(y, ratio - 1, left=1, color="tab:green" if ratio >= 1 else "tab:red")
        right.text(ratio if ratio >= 1 else 1, y, f" {_times(ratio)} vs {r.anchor}", va="center", fontsize=7)
    right.set_xscale("log")
    known = [x for x in ratios if x]
    low, high = min([0.5] + known) / 1.5, max([2.0] + known)
    right.set_xlim(low, high * (high / low) ** 0.9)  # room for the words after the longest bar
    right.axvline(1, color="grey", linewidth=0.8)
    right.set_title("speed-up over the anchor", fontsize=9)
    right.set_xlabel("anchor time / cvops time, log scale\n(>1: cvops faster)", fontsize=8)
    text = "\n".join(textwrap.fill(t, 140) for t in [title, *notes] if t)
    fig.suptitle(text, fontsize=9, x=0.01, ha="left")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # "tight": the title and labels are never cut
    plt.close(fig)
    return True
