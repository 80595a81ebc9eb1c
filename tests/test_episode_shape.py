"""One episode shape into the trainers: the engine's :class:`~clawgym_env.episodes.run.EpisodeResult`.

It is the ``(record, calls)`` pair the trainers unpack, named; a gym step's ``info`` converts at its
boundary with :meth:`EpisodeResult.from_info`, and any other shape handed to the trainers is a
``TypeError`` that names the conversion.
"""

from __future__ import annotations

import pytest

from clawgym_env.capture.records import CallRecord, EpisodeRecord
from clawgym_env.episodes.run import EpisodeResult
from clawgym_env.errors import ConfigError
from trainers.batch.groups import as_episode, make_groups


def _episode(eid: str, reward: float) -> EpisodeResult:
    rec = EpisodeRecord(episode_id=eid, task_id="t", suite="unit", harness="mini", policy="fake", status="ok",
                        reward=reward, num_calls=1)
    call = CallRecord(episode_id=eid, call_index=0, dialect="openai_chat", path="/v1/chat/completions", stream=False,
                      request={}, prompt_token_ids=[1, 2], output_token_ids=[3, 4], output_logprobs=[-0.5, -0.25],
                      finish_reason="stop")
    return EpisodeResult(rec, [call])


def _info(result: EpisodeResult) -> dict:
    """What ``ClawGymEnv.step`` puts in its ``info`` for an episode."""
    rec = result.record
    return {"status": rec.status, "subscores": dict(rec.subscores), "timings": dict(rec.timings),
            "episode": rec.model_dump(mode="json"), "calls": [c.model_dump(mode="json") for c in result.calls],
            "is_infra_failure": rec.is_infra_failure}


def test_an_episode_result_is_the_pair_the_trainers_unpack():
    res = _episode("a", 1.0)
    rec, calls = res
    assert (rec, calls) == res and rec is res.record and calls is res.calls
    assert isinstance(res, tuple) and len(res) == 2


def test_from_info_is_the_episode_the_step_ran():
    res = _episode("a", 1.0)
    back = EpisodeResult.from_info(_info(res))
    assert isinstance(back, EpisodeResult)
    assert back.record == res.record and back.calls == res.calls
    assert EpisodeResult.from_info({"episode": res.record, "calls": res.calls}) == res  # records as they are


def test_from_info_names_what_is_missing():
    with pytest.raises(ConfigError, match="'episode' and 'calls'.*status"):
        EpisodeResult.from_info({"status": "ok"})
    with pytest.raises(ConfigError, match="got list"):
        EpisodeResult.from_info([])  # type: ignore[arg-type]


def test_as_episode_takes_the_result_or_its_plain_pair():
    res = _episode("a", 1.0)
    got = as_episode(res)
    assert isinstance(got, EpisodeResult) and got == res and got.calls is not res.calls  # its own list
    pair = as_episode((res.record, tuple(res.calls)))
    assert isinstance(pair, EpisodeResult) and pair == res


@pytest.mark.parametrize(("item", "fix"), [
    (_info(_episode("a", 1.0)), r"EpisodeResult\.from_info\(info\)"),
    (_episode("a", 1.0).record, r"EpisodeResult\(record, calls\)"),
    ({"record": 1}, r"pass an EpisodeResult"),
    (("record", []), r"pass an EpisodeResult"),
])
def test_any_other_shape_is_a_type_error_naming_the_conversion(item, fix):
    with pytest.raises(TypeError, match=fix):
        as_episode(item)
    with pytest.raises(TypeError, match=fix):
        make_groups([_episode("b", 0.0), item])


def test_infos_converted_at_the_boundary_group_like_results():
    results = [_episode("a", 1.0), _episode("b", 0.0)]
    via_info = make_groups([EpisodeResult.from_info(_info(r)) for r in results])
    direct = make_groups(results)
    assert [(g.key, g.rewards, g.advantages, g.skipped) for g in via_info] == \
        [(g.key, g.rewards, g.advantages, g.skipped) for g in direct]
