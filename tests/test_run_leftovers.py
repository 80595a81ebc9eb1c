"""What a restart reaps of a dead run's episode folders (clawgym_env.sandbox.leftovers).

A run killed between writing an episode's ``episode.json`` and appending its results row leaves a
finished folder no row references; the restart redoes that episode, so the folder is the dead run's
leftover. Finished folders from before any dead run (e.g. rows the user deleted) keep their record.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path

from clawgym_env.sandbox.leftovers import RUNS, RunLock, reap_orphan_episodes


def _dead_run(state: Path, results: Path, started: float, name: str = "4242-deadbeef") -> None:
    entry = state / RUNS / name
    entry.mkdir(parents=True)
    (entry / "lock").touch()  # nobody holds its flock: the run is dead
    iso = dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(timespec="seconds")
    (entry / "owner.json").write_text(json.dumps({"pid": 4242, "results": str(results), "started": iso,
                                                  "tmp": ""}))


def _episode(root: Path, name: str, *, finished_at: float | None, workspace: bool = True) -> Path:
    d = root / name
    d.mkdir(parents=True)
    if workspace:
        (d / "workspace").mkdir()
        (d / "workspace" / "out.txt").write_text("x")
    if finished_at is not None:
        (d / "episode.json").write_text("{}")
        os.utime(d / "episode.json", (finished_at, finished_at))
    return d


def test_a_restart_reaps_what_the_dead_run_finished_but_never_recorded(tmp_path):
    episodes, results = tmp_path / "results-episodes", (tmp_path / "results.jsonl").resolve()
    now = time.time()
    _dead_run(episodes, results, started=now - 100)
    recorded = _episode(episodes, "a-s0-a1-1", finished_at=now - 50)
    cut = _episode(episodes, "a-s1-a1-2", finished_at=now - 10)  # killed before its row landed
    unfinished = _episode(episodes, "b-s0-a1-3", finished_at=None)
    older = _episode(episodes, "b-s1-a1-4", finished_at=now - 3600)  # before the dead run: not its
    with RunLock(episodes, results=results) as run:
        reap_orphan_episodes(episodes, {str(recorded)}, run.reaped, results=results)
        assert set(run.reaped.episode_dirs) == {str(cut), str(unfinished), str(older / "workspace")}
    assert (recorded / "workspace" / "out.txt").is_file()  # a referenced folder is never touched
    assert not cut.exists() and not unfinished.exists()
    assert (older / "episode.json").is_file() and not (older / "workspace").exists()


def test_a_dead_run_of_another_results_file_claims_no_finished_episode(tmp_path):
    episodes, results = tmp_path / "shared-episodes", (tmp_path / "mine.jsonl").resolve()
    now = time.time()
    _dead_run(episodes, (tmp_path / "theirs.jsonl").resolve(), started=now - 100)
    theirs = _episode(episodes, "a-s0-a1-1", finished_at=now - 10, workspace=False)
    with RunLock(episodes, results=results) as run:
        assert list(run.reaped.dead_started) == [str((tmp_path / "theirs.jsonl").resolve())]
        reap_orphan_episodes(episodes, set(), run.reaped, results=results)
        assert run.reaped.episode_dirs == []
    assert (theirs / "episode.json").is_file()


def test_a_live_run_on_the_folder_stops_every_reap(tmp_path):
    episodes, results = tmp_path / "results-episodes", (tmp_path / "results.jsonl").resolve()
    unfinished = _episode(episodes, "a-s0-a1-1", finished_at=None)
    with RunLock(episodes, results=results):
        with RunLock(episodes, results=results) as second:
            assert second.reaped.live_runs == 1
            reap_orphan_episodes(episodes, set(), second.reaped, results=results)
            assert second.reaped.episode_dirs == []
    assert unfinished.is_dir()
