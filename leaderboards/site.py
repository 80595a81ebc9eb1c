"""Leaderboard outputs from results files: a Markdown table, a static HTML page, bar-chart PNGs.

``build_site(["results/a.jsonl", ...], "site/")`` writes:
  * ``site/leaderboard.md`` — per suite, the entries (policy × harness) ranked by Pass@1, then the
    per-category breakdown;
  * ``site/index.html`` — the same tables in one self-contained page (inline CSS and a few lines
    of inline JS: click a column header to sort, or open ``index.html#sort=3`` / ``#sort=3-`` to
    sort every table by its fourth column ascending / descending), opened from disk, no network;
  * ``site/bar_<suite>.png`` — one bar chart per suite (Pass@1 and strict success with their 95%
    bootstrap intervals), referenced by relative links from both pages.

Invariants: numbers are percentages with one decimal; every cell a user sees is HTML-escaped;
each HTML data row carries ``data-suite``, ``data-policy`` and ``data-harness`` and each sortable
cell a ``data-v`` sort value; a results line that cannot be read is skipped and reported on the page.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from leaderboards.metrics import GroupSummary, summarize
from leaderboards.schema import read_results

HEAD = ["#", "Policy", "Harness", "Pass@1 (mean reward)", "Strict success", "Pass@k", "Tasks", "Episodes",
        "Infra failures"]
CAT_HEAD = ["Policy", "Harness", "Category", "Pass@1 (mean reward)", "Strict success", "Tasks", "Episodes",
            "Infra failures"]


def pct(x: float) -> str:
    """A share as a percentage with one decimal; ``–`` for a missing (NaN) value."""
    return "–" if x is None or math.isnan(x) else f"{100 * x:.1f}"


def with_ci(x: float, ci: tuple[float, float]) -> str:
    """A share and its interval as ``pct [lo, hi]``; ``–`` when the share is missing."""
    if math.isnan(x):
        return "–"
    return f"{pct(x)} [{pct(ci[0])}, {pct(ci[1])}]"


def best_k(s: GroupSummary) -> tuple[int, float] | None:
    """``(k, Pass@k)`` at the largest k the group has, or ``None``."""
    return (max(s.pass_at_k), s.pass_at_k[max(s.pass_at_k)]) if s.pass_at_k else None


def chart_name(suite: str) -> str:
    """The bar chart's file name for ``suite`` (characters unsafe in a file name become ``_``)."""
    return "bar_" + (re.sub(r"[^A-Za-z0-9_.-]+", "_", suite) or "suite") + ".png"


def _by_suite(summaries: Sequence[GroupSummary]) -> dict[str, list[GroupSummary]]:
    out: dict[str, list[GroupSummary]] = {}
    for s in summaries:
        out.setdefault(s.suite, []).append(s)
    return out


def _cells(s: GroupSummary, rank: int | None) -> list[tuple[str, str]]:
    """(display text, sort value) per column of an entry (``rank`` None: a category row)."""
    k = best_k(s)
    nums = lambda x: "" if math.isnan(x) else f"{x:.6f}"  # noqa: E731
    cells = [(s.policy, s.policy), (s.harness, s.harness)]
    cells = ([(str(rank), str(rank))] + cells) if rank is not None else cells + [(s.category or "", s.category or "")]
    cells += [(with_ci(s.pass1, s.pass1_ci), nums(s.pass1)), (with_ci(s.strict, s.strict_ci), nums(s.strict))]
    if rank is not None:
        cells.append((f"{pct(k[1])} (k={k[0]})" if k else "–", f"{k[1]:.6f}" if k else ""))
    cells += [(str(s.tasks), str(s.tasks)), (str(s.episodes), str(s.episodes)),
              (str(s.infra_failures), str(s.infra_failures))]
    return cells


def not_scored_notes(entries: Sequence[GroupSummary]) -> list[str]:
    """One line per entry with episodes that were not scored: where they failed (status/boundary)."""
    return [f"{s.policy} · {s.harness}: " + ", ".join(f"{k} ×{v}" for k, v in s.not_scored.items())
            for s in entries if s.not_scored]


def markdown(summaries: Sequence[GroupSummary], *, bad_lines: int = 0) -> str:
    """The leaderboard as Markdown: what the metrics mean, then per suite its chart, its table, what was not
    scored, and a per-category table when rows have categories."""
    lines = ["# ClawGym leaderboard", "",
             "Pass@1 is the mean reward, strict success the share of episodes with reward 1, both averaged "
             "over tasks, with 95% bootstrap intervals over tasks in brackets; Pass@k is the unbiased "
             "estimator at the largest k every task has samples for. Infrastructure failures (and episodes "
             "with no valid reward) are counted per harness with where they happened, not scored.", ""]
    if bad_lines:
        lines += [f"> {bad_lines} unreadable results line(s) were skipped.", ""]
    for suite, group in _by_suite(summaries).items():
        entries = [s for s in group if s.category is None]
        lines += [f"## {suite}", "", f"![{suite}]({chart_name(suite)})", "",
                  "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
        lines += ["| " + " | ".join(t.replace("|", "\\|") for t, _ in _cells(s, i)) + " |"
                  for i, s in enumerate(entries, 1)]
        notes = not_scored_notes(entries)
        if notes:
            lines += ["", "Not scored (status/where it failed):", ""] + [f"- {n}" for n in notes]
        cats = [s for s in group if s.category is not None]
        if cats:
            lines += ["", f"### {suite} by category", "", "| " + " | ".join(CAT_HEAD) + " |",
                      "|" + "---|" * len(CAT_HEAD)]
            lines += ["| " + " | ".join(t.replace("|", "\\|") for t, _ in _cells(s, None)) + " |" for s in cats]
        lines.append("")
    return "\n".join(lines)


_CSS = """body{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;
padding:0 1rem;color:#1d2330}h1{margin-bottom:.2rem}p.note{color:#555;max-width:60rem}
table{border-collapse:collapse;width:100%;margin:.6rem 0 1.6rem}th,td{padding:.4rem .6rem;border-bottom:1px solid #dde;
text-align:left;white-space:nowrap}th{background:#f2f4f8;cursor:pointer;user-select:none}th:hover{background:#e4e8f0}
th.asc::after{content:" ▲"}th.desc::after{content:" ▼"}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr:nth-child(even) td{background:#fafbfd}img.chart{max-width:100%;border:1px solid #dde;margin:.4rem 0}
.warn{background:#fff4d6;padding:.5rem .8rem;border-left:4px solid #e0a800}"""

_JS = """document.querySelectorAll('table.lb').forEach(function(t){
 t.querySelectorAll('th').forEach(function(th,i){th.addEventListener('click',function(){
  var asc=!th.classList.contains('asc');t.querySelectorAll('th').forEach(function(h){h.classList.remove('asc','desc')});
  th.classList.add(asc?'asc':'desc');var b=t.tBodies[0],rows=Array.prototype.slice.call(b.rows);
  rows.sort(function(x,y){var a=x.cells[i].dataset.v,c=y.cells[i].dataset.v,na=parseFloat(a),nc=parseFloat(c);
   var r=(!isNaN(na)&&!isNaN(nc))?na-nc:String(a).localeCompare(String(c));return asc?r:-r});
  rows.forEach(function(r){b.appendChild(r)});});});});
var m=location.hash.match(/sort=([0-9]+)(-?)/);if(m){document.querySelectorAll('table.lb').forEach(function(t){
 var th=t.querySelectorAll('th')[+m[1]];if(th){th.click();if(m[2])th.click();}});}"""


def _table(head: list[str], rows: Iterable[tuple[GroupSummary, list[tuple[str, str]]]], cls: str) -> str:
    out = [f'<table class="lb {cls}"><thead><tr>' + "".join(f"<th>{html.escape(h)}</th>" for h in head)
           + "</tr></thead><tbody>"]
    for s, cells in rows:
        attrs = (f' data-suite="{html.escape(s.suite)}" data-policy="{html.escape(s.policy)}"'
                 f' data-harness="{html.escape(s.harness)}"'
                 + (f' data-category="{html.escape(s.category)}"' if s.category else ""))
        tds = "".join(f'<td data-v="{html.escape(v)}"{" class=n" if i >= 3 else ""}>{html.escape(t)}</td>'
                      for i, (t, v) in enumerate(cells))
        out.append(f"<tr{attrs}>{tds}</tr>")
    return "\n".join(out) + "</tbody></table>"


def html_page(summaries: Sequence[GroupSummary], *, charts: dict[str, str], bad_lines: int = 0) -> str:
    """The leaderboard as one static HTML page (inline CSS), with the charts named in ``charts``."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             "<title>ClawGym leaderboard</title>", f"<style>{_CSS}</style></head><body>",
             "<h1>ClawGym leaderboard</h1>",
             '<p class="note">Pass@1 is the mean reward, strict success the share of episodes with reward 1, both '
             "averaged over tasks, with 95% bootstrap intervals over tasks in brackets (percent). Pass@k is the "
             "unbiased estimator at the largest k every task has samples for. Infrastructure failures are "
             "counted, not scored. Click a column header to sort.</p>"]
    if bad_lines:
        parts.append(f'<p class="warn">{bad_lines} unreadable results line(s) were skipped.</p>')
    for suite, group in _by_suite(summaries).items():
        entries = [s for s in group if s.category is None]
        parts.append(f'<h2 id="suite-{html.escape(suite)}">{html.escape(suite)}</h2>')
        parts.append(_table(HEAD, [(s, _cells(s, i)) for i, s in enumerate(entries, 1)], "entries"))
        notes = not_scored_notes(entries)
        if notes:
            parts.append('<p class="note not-scored">Not scored (status/where it failed): '
                         + "; ".join(html.escape(n) for n in notes) + "</p>")
        if suite in charts:
            parts.append(f'<img class="chart" src="{html.escape(charts[suite])}" alt="Pass@1 and strict success '
                         f'on {html.escape(suite)}">')
        cats = [s for s in group if s.category is not None]
        if cats:
            parts.append(f"<h3>{html.escape(suite)} by category</h3>")
            parts.append(_table(CAT_HEAD, [(s, _cells(s, None)) for s in cats], "categories"))
    parts += [f"<script>{_JS}</script>", "</body></html>"]
    return "\n".join(parts)


def bar_chart(entries: Sequence[GroupSummary], path: Path, title: str) -> Path:
    """Horizontal grouped bars (Pass@1, strict success) with 95% CI whiskers, best entry on top."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np

    entries = [e for e in entries if not math.isnan(e.pass1)][::-1]
    labels = [e.label for e in entries]
    y = np.arange(len(entries))
    fig, ax = plt.subplots(figsize=(8.5, 2.0 + 0.62 * max(len(entries), 1)), dpi=110)
    for off, name, vals, cis, color in ((0.19, "Pass@1 (mean reward)", [e.pass1 for e in entries],
                                         [e.pass1_ci for e in entries], "#3b6fd4"),
                                        (-0.19, "Strict success", [e.strict for e in entries],
                                         [e.strict_ci for e in entries], "#f08a24")):
        v = np.array(vals) * 100
        err = np.array([[max(val - lo * 100, 0), max(hi * 100 - val, 0)] for val, (lo, hi) in zip(v, cis)]).T
        ax.barh(y + off, v, height=0.36, color=color, label=name,
                xerr=err if len(entries) else None, capsize=3, error_kw={"elinewidth": 1, "ecolor": "#333"})
        for yi, val, (_, hi) in zip(y + off, v, cis):  # the label sits right of the whisker
            ax.text(max(val, hi * 100) + 1.5, yi, f"{val:.1f}", va="center", fontsize=9)
    ax.set_yticks(y, labels)
    ax.set_xlim(0, 115)
    ax.set_xlabel("percent (95% bootstrap CI over tasks)")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    handles, names = ax.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=2, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.35 / fig.get_figheight(), 1, 1))  # room for the legend under the axis
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def build_site(results: Iterable[str | Path], out_dir: str | Path, *, n_boot: int = 2000,
               seed: int = 0) -> dict[str, Path]:
    """Write the Markdown table, the HTML page and one chart per suite; returns their paths by name."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    read = read_results(list(results))
    summaries = summarize(read.rows, n_boot=n_boot, seed=seed)
    written: dict[str, Path] = {}
    charts: dict[str, str] = {}
    for suite, group in _by_suite(summaries).items():
        name = chart_name(suite)
        written[name] = bar_chart([s for s in group if s.category is None], out_dir / name, f"{suite}")
        charts[suite] = name
    md = out_dir / "leaderboard.md"
    md.write_text(markdown(summaries, bad_lines=read.bad_lines), encoding="utf-8")
    page = out_dir / "index.html"
    page.write_text(html_page(summaries, charts=charts, bad_lines=read.bad_lines), encoding="utf-8")
    written.update({"leaderboard.md": md, "index.html": page})
    return written
