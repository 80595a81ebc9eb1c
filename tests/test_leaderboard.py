"""Metrics with hand-computed values, and the leaderboard site rendered in headless Chromium."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from leaderboards.metrics import bootstrap_ci, pass_at_k, summarize
from leaderboards.schema import ResultRow, latest_by_key, read_results


def row(task, reward, *, sample=0, status="ok", suite="s1", harness="mini", policy="p", category=None):
    return ResultRow(suite=suite, task_id=task, category=category, harness=harness, policy=policy, sample=sample,
                     status=status, reward=reward)


# -- Pass@k and bootstrap ----------------------------------------------------------------------

@pytest.mark.parametrize("n,c,k,expected", [
    (5, 2, 1, 0.4),                 # = c / n
    (5, 2, 2, 0.7),                 # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (10, 3, 5, 1 - 21 / 252),       # 1 - C(7,5)/C(10,5)
    (4, 1, 4, 1.0),                 # n - c < k: every draw of 4 contains the success
    (5, 0, 3, 0.0),
    (5, 5, 1, 1.0),
    (3, 1, 2, 1 - 1 / 3),           # 1 - C(2,2)/C(3,2)
])
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_rejects_impossible_counts():
    for n, c, k in ((3, 4, 1), (3, 1, 0), (3, 1, 4)):
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_bootstrap_ci_hand_computed_and_seeded():
    # two tasks [0, 1]: resampled means are 0 (p=1/4), 0.5 (1/2), 1 (1/4) -> the 95% interval is [0, 1]
    assert bootstrap_ci([0.0, 1.0], n_boot=4000, seed=1) == (0.0, 1.0)
    assert bootstrap_ci([0.3, 0.3, 0.3]) == (0.3, 0.3)
    assert all(math.isnan(x) for x in bootstrap_ci([]))
    values = [0.0, 0.2, 1.0, 1.0, 0.5, 0.9, 0.1, 0.7]
    a, b = bootstrap_ci(values, seed=7), bootstrap_ci(values, seed=7)
    assert a == b, "same seed, same interval"
    assert a[0] < sum(values) / len(values) < a[1]
    assert 0.0 <= a[0] and a[1] <= 1.0
    assert bootstrap_ci(values, seed=8) != a, "the seed is used"


# -- summaries --------------------------------------------------------------------------------

def _rows():
    return [
        row("A", 0.0, sample=0, status="infra_error", category="x"),   # superseded by the next A#0 row
        row("A", 1.0, sample=0, category="x"),
        row("A", 0.5, sample=1, category="x", status="reward_error"),
        row("B", 1.0, sample=0, category="y"),
        row("B", 1.0, sample=1, category="y"),
        row("B", 0.0, sample=2, category="y", status="infra_error"),   # counted, not scored
        row("C", 0.0, sample=0, category="y", status="infra_error"),   # a task with no valid sample
        row("A", 0.0, sample=0, harness="other", category="x"),
        row("A", 0.0, sample=1, harness="other", category="x"),
    ]


def test_summarize_hand_computed():
    summaries = summarize(_rows(), n_boot=500)
    overall = [s for s in summaries if s.category is None]
    assert [(s.harness, s.policy) for s in overall] == [("mini", "p"), ("other", "p")], "ranked by Pass@1"
    top = overall[0]
    # A: rewards 1, 0.5 -> mean 0.75, strict 1/2; B: 1, 1 -> 1, 2/2; C: only infra -> left out
    assert top.pass1 == pytest.approx((0.75 + 1.0) / 2)
    assert top.strict == pytest.approx((0.5 + 1.0) / 2)
    assert top.pass_at_k == pytest.approx({1: 0.75, 2: 1.0})  # A: 1 - C(1,2)/C(2,2) = 1 (n-c < k)
    assert (top.tasks, top.episodes, top.infra_failures, top.tasks_without_valid_samples) == (2, 4, 2, 1)
    assert top.min_samples == 2
    assert top.pass1_ci[0] <= top.pass1 <= top.pass1_ci[1]
    cats = {s.category: s for s in summaries if s.category is not None and s.harness == "mini"}
    assert cats["x"].pass1 == pytest.approx(0.75) and cats["x"].strict == pytest.approx(0.5)
    assert cats["x"].pass1_ci == (0.75, 0.75)  # one task: no spread
    assert cats["y"].pass1 == pytest.approx(1.0) and cats["y"].infra_failures == 2
    assert cats["y"].tasks_without_valid_samples == 1
    other = overall[1]
    assert other.pass1 == 0.0 and other.strict == 0.0 and other.pass_at_k == {1: 0.0, 2: 0.0}


def test_infra_only_group_has_no_score_but_counts():
    s = summarize([row("A", 0.0, status="infra_error"), row("B", 0.0, status="infra_error")])[0]
    assert s.tasks == 0 and s.infra_failures == 2 and math.isnan(s.pass1) and s.pass_at_k == {}


def test_no_valid_reward_is_not_scored_and_failures_are_counted_per_harness_and_boundary(tmp_path):
    """A judge failure (reward_invalid) never lowers a mean; every unscored row is counted per harness
    with where it failed, in the summary, the Markdown page and the training metrics."""
    from clawgym_env.capture.records import EpisodeRecord
    from leaderboards.site import markdown
    from trainers.metrics import rollout_metrics

    rows = [row("A", 1.0), row("A", 0.0, sample=1, status="reward_invalid"),
            row("B", 0.0).model_copy(update={"status": "infra_error", "failure_boundary": "policy"}),
            row("B", 0.5, sample=1), row("A", 0.0, harness="codex").model_copy(
                update={"status": "infra_error", "failure_boundary": "sandbox"})]
    mini, codex = sorted(summarize(rows, by_category=False), key=lambda s: s.harness != "mini")
    assert (mini.tasks, mini.episodes, mini.pass1) == (2, 2, pytest.approx(0.75))
    assert mini.infra_failures == 2 and mini.not_scored == {"infra_error/policy": 1, "reward_invalid/?": 1}
    assert codex.not_scored == {"infra_error/sandbox": 1} and codex.tasks == 0
    assert "p · mini: infra_error/policy ×1, reward_invalid/? ×1" in markdown([mini, codex])
    recs = [EpisodeRecord(episode_id=str(i), task_id=r.task_id, harness=r.harness, policy="p", status=r.status,
                          reward=r.reward, failure_boundary=r.failure_boundary) for i, r in enumerate(rows)]
    m = rollout_metrics(recs)
    assert (m["episodes"], m["infra_failures"], m["reward_mean"]) == (2, 3, pytest.approx(0.75))
    assert m["mini/infra_failures"] == 2 and m["codex/infra_failures"] == 1 and m["codex/episodes"] == 0
    assert m["mini/not_scored/infra_error/policy"] == 1 and m["codex/not_scored/infra_error/sandbox"] == 1
    assert all(not r.is_task_outcome and r.is_infra_failure for r in recs if r.status != "ok")


def test_reading_skips_torn_lines_and_keeps_last_row_per_key(tmp_path):
    p = tmp_path / "r.jsonl"
    rows = _rows()
    p.write_text("".join(r.model_dump_json() + "\n" for r in rows) + '{"suite": "s1", "task_id": "A", "har')
    read = read_results(p)
    assert read.bad_lines == 1 and len(read.rows) == len(rows)
    latest = latest_by_key(read.rows)
    assert len(latest) == len(rows) - 1
    a0 = [r for r in latest if r.key == ("s1", "A", "mini", "p", 0)]
    assert len(a0) == 1 and a0[0].status == "ok" and a0[0].reward == 1.0


# -- the site, in a real browser --------------------------------------------------------------

def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _browser(url: str, tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    exe = _chromium()
    if exe is None:
        pytest.skip("headless Chromium is not installed (scripts/install.sh installs it)")
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    argv = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
            f"--user-data-dir={profile}", *extra, url]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


class _Rows(HTMLParser):
    """Data rows of the page's tables: (table classes, row attributes, cell texts)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[str, dict, list[str]]] = []
        self._table = ""
        self._row: tuple[str, dict, list[str]] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._table = a.get("class", "")
        elif tag == "tr" and "data-policy" in a:
            self._row = (self._table, a, [])
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "td" and self._row is not None and self._cell is not None:
            self._row[2].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _site_rows() -> list[ResultRow]:
    out = _rows()
    for t, rewards in (("t1", [1.0, 1.0]), ("t2", [0.0, 1.0]), ("t3", [0.25, 0.75])):
        for i, r in enumerate(rewards):
            out.append(row(t, r, sample=i, suite="suite<two>", harness="codex", policy="api:model-a",
                           category="office"))
            out.append(row(t, r / 2, sample=i, suite="suite<two>", harness="claude-code", policy="api:model-b",
                           category="office"))
    return out


def test_leaderboard_site_renders_in_chromium(tmp_path):
    from clawgym_cli.main import main

    results = tmp_path / "results"
    results.mkdir()
    rows = _site_rows()
    (results / "a.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in rows[:9]))
    (results / "b.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in rows[9:]) + '{"torn')
    site = tmp_path / "site"
    assert main(["leaderboard", str(results / "a.jsonl"), str(results / "b.jsonl"), "--out", str(site)]) == 0
    md = (site / "leaderboard.md").read_text()
    assert "| 1 | p | mini | 87.5 [" in md and "1 unreadable results line(s)" in md
    charts = sorted(p.name for p in site.glob("bar_*.png"))
    assert charts == ["bar_s1.png", "bar_suite_two_.png"]
    for c in charts:
        assert (site / c).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({c})" in md
    page = (site / "index.html").read_text()
    assert "http://" not in page and "https://" not in page, "no external assets"

    dom = _browser((site / "index.html").as_uri(), tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    parsed = _Rows()
    parsed.feed(dom.stdout)
    entries = [(a["data-suite"], a["data-policy"], a["data-harness"], cells)
               for cls, a, cells in parsed.rows if "entries" in cls]
    assert [(s, p, h) for s, p, h, _ in entries] == [
        ("s1", "p", "mini"), ("s1", "p", "other"),
        ("suite<two>", "api:model-a", "codex"), ("suite<two>", "api:model-b", "claude-code")]
    first = entries[0][3]
    assert first[:3] == ["1", "p", "mini"] and first[3].startswith("87.5 [") and first[4].startswith("75.0 [")
    assert first[5] == "100.0 (k=2)" and first[6:] == ["2", "4", "2"]
    # suite<two>, model-a: t1 1.0, t2 0.5, t3 0.5 -> Pass@1 66.7; strict (1 + 0.5 + 0) / 3 -> 50.0
    assert entries[2][3][3].startswith("66.7 [") and entries[2][3][4].startswith("50.0 [")
    cats = [(a["data-suite"], a.get("data-category"), cells[3]) for cls, a, cells in parsed.rows if "categories" in cls]
    assert ("s1", "x", "75.0 [75.0, 75.0]") in cats and len(cats) == 5
    assert dom.stdout.count('<img class="chart" src="bar_') == 2

    # the inline script runs: #sort=3 orders every table by its 4th column (Pass@1) ascending
    dom = _browser((site / "index.html").as_uri() + "#sort=3", tmp_path, "--dump-dom")
    parsed = _Rows()
    parsed.feed(dom.stdout)
    order = [a["data-harness"] for cls, a, _ in parsed.rows if "entries" in cls]
    assert order == ["other", "mini", "claude-code", "codex"], order
    assert 'class="asc"' in dom.stdout

    shot = tmp_path / "leaderboard.png"
    res = _browser((site / "index.html").as_uri(), tmp_path, f"--screenshot={shot}", "--window-size=1280,1400",
                   "--hide-scrollbars")
    assert res.returncode == 0 and shot.exists() and shot.stat().st_size > 20_000, res.stderr[-2000:]


def test_html_escapes_user_text(tmp_path):
    from leaderboards.site import build_site

    p = tmp_path / "r.jsonl"
    p.write_text(row("t", 1.0, policy="<script>alert(1)</script>").model_dump_json() + "\n")
    build_site([p], tmp_path / "site", n_boot=100)
    page = (tmp_path / "site" / "index.html").read_text()
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert re.search(r"<script>[^<]*location\.hash", page), "the page's own script is there"
