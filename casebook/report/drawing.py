"""What every figure shares: the Agg backend and SVG settings, the face label, plain
log ticks, the time unit, and the atomic SVG write."""

from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib import ticker

from casebook.core import files
from casebook.report.evidence import Evidence

plt.rcParams.update({"svg.hashsalt": "casebook", "svg.fonttype": "none", "font.size": 9})
# Every figure is drawn this wide and no text smaller, so that shown at the case page's
# figure width (about 700 px, or scrolled at no less on a phone) no label is under 9 px
# (tests/site/test_browser.py measures it).
WIDTH_IN = 6.4
MIN_FONT_PT = 7


def face_label(ev: Evidence, made: list[dict[str, Any]]) -> str:
    """What every figure says on its face about where its numbers come from and what ran
    to make them (the records ``made``): a numerics model, an interpreted kernel, ..."""
    gpu = ev.host["gpus"][0]["name"] if ev.host["gpus"] else None
    tpu = ev.host["tpus"][0]["name"] if ev.host.get("tpus") else None
    where = f"{ev.target.upper()} ({gpu or tpu})" if gpu or tpu else \
        f"{ev.target.upper()} (no GPU)"
    interpreted = any(c.get("execution", {}).get("interpret") for r in made
                      for c in r.get("checks", [r]))
    mode = ("Pallas interpret mode on the host — not GPU time" if interpreted else
            "on the GPU" if gpu else "on the TPU (device time)" if tpu else
            "on the host CPU — not GPU time")
    return " · ".join([where, *ev.subjects(made), mode])


def save(fig: plt.Figure, path: str) -> None:
    """Write ``fig`` to ``path`` as SVG, atomically, with no date (reruns compare), and
    close it. Its titles wrap at its edges, so that a long face label cannot widen it."""
    for text in (fig.texts + [ax.title for ax in fig.axes]):
        text.set_wrap(True)
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None}, bbox_inches="tight")
    plt.close(fig)
    files.atomic_write_text(path, buffer.getvalue())


def outputs_of(record: dict[str, Any]) -> tuple[str, ...]:
    """The outputs a verify record's (or a baseline's check's) kernel computed."""
    checks = record.get("checks") or [record.get("check") or {}]
    return tuple(dict.fromkeys(name for c in checks for name in c.get("outputs", {})))


class PlainLog(ticker.LogFormatter):
    """Log-axis tick labels as plain numbers ("30", "0.05"), never "3×10⁻²"."""

    def _num_to_string(self, x, vmin, vmax):
        return f"{x:g}"


def plain_log_ticks(axis) -> None:
    """Label a log axis's decades and, within a decade or two, some of its minor ticks,
    in plain numbers."""
    axis.set_major_formatter(PlainLog())
    axis.set_minor_formatter(PlainLog(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def time_unit(seconds: list[float]) -> tuple[str, float]:
    """The unit a time axis reads in (µs below a millisecond, else ms) and its scale."""
    return ("µs", 1e6) if max(seconds, default=0) < 1e-3 else ("ms", 1e3)
