"""``MemorySnapshots`` refuses a keyword it does not know as ``ProfilerConfig`` does: guessing the mistake."""

from __future__ import annotations

import pickle

import pytest

import instrument as ins


def test_an_unknown_keyword_gets_a_did_you_mean() -> None:
    with pytest.raises(
        TypeError,
        match=r"MemorySnapshots\(\) got an unexpected keyword argument 'max_entry'; "
        r"did you mean 'max_entries'\?",
    ):
        ins.MemorySnapshots(max_entry=10)  # type: ignore[call-arg]


def test_a_keyword_like_none_lists_the_valid_ones() -> None:
    with pytest.raises(TypeError, match=r"valid keywords: max_entries, stack_depth, context, stacks, on_oom"):
        ins.MemorySnapshots(zzz=1)  # type: ignore[call-arg]


def test_known_keywords_and_values_still_work_and_pickle() -> None:
    snapshots = ins.MemorySnapshots(on_oom=True, stack_depth=8)
    assert snapshots.on_oom and snapshots.stack_depth == 8
    assert pickle.loads(pickle.dumps(snapshots)) == snapshots  # Ray ships configurations pickled
    with pytest.raises(ValueError, match="stacks"):
        ins.MemorySnapshots(stacks="cpp")
    assert ins.ProfilerConfig(memory={"on_oom": True}).memory == ins.MemorySnapshots(on_oom=True)
