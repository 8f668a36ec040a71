"""Plots as inline SVG (matplotlib, Agg): no files, no fonts fetched, no script.

Text stays text (``svg.fonttype = none``), which matplotlib writes XML-escaped;
:func:`to_svg` then drops what an inline ``<svg>`` in HTML does not need (the
XML header, DOCTYPE, RDF metadata, comments and the ``xmlns`` URLs, so the
page contains no URL at all) and prefixes every id, so several plots can share
one page without their clip paths and markers colliding.
"""

from __future__ import annotations

import io
import itertools
import math
import re
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # never a window; safe before pyplot is imported

import matplotlib.pyplot as plt
from markupsafe import Markup

_ids = itertools.count(1)
STYLE = {"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False, "axes.spines.right": False,
         "font.family": "sans-serif"}


def to_svg(fig) -> Markup:
    """The figure as an inline ``<svg>`` element (closed afterwards)."""
    n = next(_ids)
    buf = io.StringIO()
    with matplotlib.rc_context({**STYLE, "svg.hashsalt": f"fedaudit-{n}"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", text)
    text = text.replace("xlink:href=", "href=")
    for old in set(re.findall(r'\bid="([^"]+)"', text)):
        text = text.replace(f'id="{old}"', f'id="f{n}-{old}"').replace(f'"#{old}"', f'"#f{n}-{old}"') \
                   .replace(f"url(#{old})", f"url(#f{n}-{old})")
    text = re.sub(r"\n\s*", "\n", text).strip()
    return Markup(text.replace("<svg ", '<svg role="img" class="plot" ', 1))  # safe: matplotlib escaped the text


def plain(text: str) -> str:
    """User text (domain names) as literal text: a pair of ``$`` would otherwise start matplotlib mathtext."""
    return str(text).replace("$", r"\$")


LINE_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"))


def rounds_plot(series: Sequence[tuple[str, list[float], list[float | None]]], ylabel: str, title: str,
                percent: bool = False) -> Markup:
    """One line per (label, rounds, values); ``None`` values are skipped."""
    with matplotlib.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(6.4, 3.0))
        for i, (label, xs, ys) in enumerate(series):
            pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
            if pts:
                # Each series its own dash and hollow marker of growing size: two series with equal values (traffic
                # up and down of a symmetric protocol) stay visible as two, not one line drawn over the other.
                dash, marker = LINE_STYLES[i % len(LINE_STYLES)]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle=dash, marker=marker,
                        markersize=3 + 1.5 * (i % len(LINE_STYLES)), markerfacecolor="none", linewidth=1.2,
                        label=plain(label))
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        ax.set_title(plain(title), loc="left")
        if percent:
            ax.set_ylim(0, 1)
        else:
            ax.set_ylim(bottom=0)
            ax.ticklabel_format(axis="y", useOffset=False, style="plain")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # series with no value at all draw nothing, and need no legend
            ax.legend(fontsize=7, frameon=False, loc="best")
        return to_svg(fig)


def roc_plot(curves: Sequence[tuple[str, list[float], list[float]]], xmin: float, title: str) -> Markup:
    """ROC curves on log-log axes from ``xmin`` with the chance line TPR = FPR."""
    with matplotlib.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(4.2, 3.6))
        grid = [xmin * (1 / xmin) ** (i / 50) for i in range(51)]
        ax.plot(grid, grid, linestyle="--", color="0.5", linewidth=1, label="chance (TPR = FPR)")
        for label, fpr, tpr in curves:
            xs = [max(float(f), xmin) for f in fpr]
            ys = [max(float(t), xmin) for t in tpr]
            ax.plot(xs, ys, linewidth=1.3, label=plain(label), drawstyle="steps-post")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(xmin, 1)
        ax.set_ylim(xmin, 1)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.set_title(plain(title), loc="left")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, frameon=False, loc="lower right")
        return to_svg(fig)


def scatter_plot(metric: str, points: Sequence[tuple[str, float, float | None, float]], xlabel: str) -> Markup:
    """Privacy–utility: x = leakage (filled: attack; hollow: its control), y = unseen-domain accuracy."""
    with matplotlib.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(5.0, 3.9))
        for label, attack, control, acc in points:
            if control is not None and math.isfinite(control):
                ax.plot([control, attack], [acc, acc], color="0.75", linewidth=1, zorder=1)
                ax.scatter([control], [acc], facecolors="none", edgecolors="0.45", s=28, zorder=2)
            ax.scatter([attack], [acc], s=34, zorder=3, label=plain(label))
        # a legend, not annotations: runs with equal numbers would print their labels on top of each other
        ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(0, -0.18), ncol=2)
        ax.set_xlabel(plain(xlabel))
        ax.set_ylabel("unseen-domain accuracy")
        ax.set_title(plain(metric), loc="left", fontsize=8)
        ax.set_ylim(0, 1.05)
        lo = min([0.0] + [p[1] for p in points] + [p[2] for p in points if p[2] is not None])
        hi = max([1.0] + [p[1] for p in points] + [p[2] for p in points if p[2] is not None])
        ax.set_xlim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
        ax.grid(alpha=0.3)
        return to_svg(fig)


def epsilon_plot(epsilons: Sequence[float | None], series: Sequence[tuple[str, list[float], list[float] | None]],
                 title: str) -> Markup:
    """Values against the DP ε on a log axis; ``None`` (no DP) is drawn at the right as ∞.
    Each series: (label, values, controls or None); controls are dashed in the same colour."""
    finite = sorted(e for e in epsilons if e is not None)
    inf_x = (finite[-1] * 4 if finite else 1.0)
    xs = [inf_x if e is None else float(e) for e in epsilons]
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    with matplotlib.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(6.4, 3.4))
        for label, values, controls in series:
            line, = ax.plot([xs[i] for i in order], [values[i] for i in order], marker="o", markersize=3, linewidth=1.2,
                            label=plain(label))
            if controls is not None:
                ax.plot([xs[i] for i in order], [controls[i] for i in order], linestyle="--", linewidth=1,
                        color=line.get_color(), label=plain(f"{label}: control"))
        ax.set_xscale("log")
        ticks = finite + ([inf_x] if None in epsilons else [])
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{t:g}" for t in finite] + (["∞ (no DP)"] if None in epsilons else []))
        ax.minorticks_off()
        ax.set_xlabel("DP-SGD ε per client")
        ax.set_ylim(0, 1.05)
        ax.set_title(plain(title), loc="left", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        return to_svg(fig)
