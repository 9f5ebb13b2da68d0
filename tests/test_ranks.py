"""Tests for ``instrument.ranks``: rank selection, replica layout and engine trace names."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from instrument.ranks import (
    engine_trace_local_rank,
    engine_trace_rank,
    is_profiled_rank,
    keep_engine_trace,
    local_rank_of,
    parse_engine_trace_name,
    profiled_ranks,
    ranks_to_keep,
    registered_trace_names,
    replica_of,
    replicas_to_drive,
    trace_names,
    validate_ranks,
)

# --- replica layout ---------------------------------------------------------------------------


@given(st.integers(min_value=0, max_value=2**40), st.integers(min_value=1, max_value=4096))
def test_replica_and_local_rank_recompose(global_rank: int, gpus_per_replica: int) -> None:
    replica, local = replica_of(global_rank, gpus_per_replica), local_rank_of(global_rank, gpus_per_replica)
    assert 0 <= local < gpus_per_replica
    assert replica * gpus_per_replica + local == global_rank


def test_replica_examples() -> None:
    assert (replica_of(5, 2), local_rank_of(5, 2)) == (2, 1)
    assert (replica_of(0, 4), local_rank_of(0, 4)) == (0, 0)
    assert (replica_of(7, 1), local_rank_of(7, 1)) == (7, 0)


@pytest.mark.parametrize("func", [replica_of, local_rank_of])
@pytest.mark.parametrize(
    ("global_rank", "gpus_per_replica", "error"),
    [
        (-1, 2, ValueError),
        (3, 0, ValueError),
        (3, -2, ValueError),
        (True, 2, TypeError),
        (3, True, TypeError),
        (1.0, 2, TypeError),
        ("1", 2, TypeError),
    ],
)
def test_replica_rejects_invalid(func, global_rank, gpus_per_replica, error) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error):
        func(global_rank, gpus_per_replica)


# --- which replicas to drive, which traces to keep ---------------------------------------------


def test_drive_and_keep_example() -> None:
    assert replicas_to_drive((0, 5), False, 8, 2) == (0, 2)
    assert ranks_to_keep(2, (0, 5), False, 8, 2) == frozenset({5})
    assert ranks_to_keep(0, (0, 5), False, 8, 2) == frozenset({0})
    assert ranks_to_keep(1, (0, 5), False, 8, 2) == frozenset()
    assert replicas_to_drive([5, 0, 5], False, 8, 2) == (0, 2)


def test_all_ranks_drives_every_replica() -> None:
    assert replicas_to_drive((), True, 8, 2) == (0, 1, 2, 3)
    assert ranks_to_keep(3, (), True, 8, 2) == frozenset({6, 7})
    assert replicas_to_drive((), True, 4, 4) == (0,)


@st.composite
def selections(draw: st.DrawFn) -> tuple[list[int], bool, int, int]:
    gpus_per_replica = draw(st.integers(min_value=1, max_value=8))
    world_size = gpus_per_replica * draw(st.integers(min_value=1, max_value=16))
    ranks = draw(st.lists(st.integers(min_value=0, max_value=world_size - 1), max_size=20))
    return ranks, draw(st.booleans()), world_size, gpus_per_replica


@given(selections())
def test_kept_ranks_of_driven_replicas_are_the_profiled_ranks(case: tuple[list[int], bool, int, int]) -> None:
    ranks, all_ranks, world_size, gpus_per_replica = case
    driven = replicas_to_drive(ranks, all_ranks, world_size, gpus_per_replica)
    kept = [ranks_to_keep(r, ranks, all_ranks, world_size, gpus_per_replica) for r in driven]
    assert all(kept), "a driven replica must keep at least one rank"
    assert frozenset().union(*kept) == frozenset(profiled_ranks(ranks, all_ranks, world_size))
    assert list(driven) == sorted(set(driven))
    for replica in range(world_size // gpus_per_replica):
        if replica not in driven:
            assert not ranks_to_keep(replica, ranks, all_ranks, world_size, gpus_per_replica)


@given(selections())
def test_with_peers_a_driven_replica_keeps_every_rank_and_no_other_replica_any(
    case: tuple[list[int], bool, int, int],
) -> None:
    ranks, all_ranks, world_size, gpus_per_replica = case
    driven = replicas_to_drive(ranks, all_ranks, world_size, gpus_per_replica)
    for replica in range(world_size // gpus_per_replica):
        kept = ranks_to_keep(replica, ranks, all_ranks, world_size, gpus_per_replica, peers=True)
        members = range(replica * gpus_per_replica, (replica + 1) * gpus_per_replica)
        assert kept == (frozenset(members) if replica in driven else frozenset())


def test_peers_keep_the_tp_peer_of_a_named_rank() -> None:
    assert ranks_to_keep(0, (0,), False, 8, 2) == frozenset({0})
    assert ranks_to_keep(0, (0,), False, 8, 2, peers=True) == frozenset({0, 1})
    assert ranks_to_keep(1, (0,), False, 8, 2, peers=True) == frozenset()


def test_out_of_range_rank_is_named() -> None:
    with pytest.raises(ValueError, match=r"rank 9\b.*8 ranks"):
        replicas_to_drive((0, 9), False, 8, 2)
    with pytest.raises(ValueError, match=r"rank 8\b"):
        ranks_to_keep(0, (8,), False, 8, 2)


def test_world_must_be_a_multiple_of_replica_size() -> None:
    with pytest.raises(ValueError, match="not a multiple of 'gpus_per_replica'"):
        replicas_to_drive((0,), False, 6, 4)
    with pytest.raises(ValueError, match="not a multiple of 'gpus_per_replica'"):
        ranks_to_keep(0, (0,), False, 6, 4)


def test_ranks_to_keep_rejects_unknown_replica() -> None:
    with pytest.raises(ValueError, match="'replica' 4 is outside"):
        ranks_to_keep(4, (0,), False, 8, 2)
    with pytest.raises(ValueError):
        ranks_to_keep(-1, (0,), False, 8, 2)
    with pytest.raises(TypeError):
        ranks_to_keep(True, (0,), False, 8, 2)


def test_drive_rejects_bad_replica_size() -> None:
    with pytest.raises(ValueError):
        replicas_to_drive((0,), False, 8, 0)
    with pytest.raises(TypeError):
        replicas_to_drive((0,), False, 8, True)


# --- engine trace names -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "local_rank"),
    [
        # vLLM >= 0.17
        ("rank3.1712345678901234567.pt.trace.json.gz", 3),
        ("rank0.1712345678901234567.pt.trace.json.gz", 0),
        ("rank12.1712345678901234567.pt.trace.json.gz", 12),
        ("step2_rank3.1712345678901234567.pt.trace.json.gz", 3),
        ("dp0_pp0_tp1_dcp0_ep1_rank1.123.pt.trace.json.gz", 1),
        ("rank3.1712345678901234567.pt.trace.json", 3),
        ("/tmp/vllm/replica2/rank3.1712345678901234567.pt.trace.json.gz", 3),
        # vLLM < 0.17
        ("5f3a-rank-2.123.pt.trace.json.gz", 2),
        ("5f3a-rank-2.123.pt.trace.json", 2),
        ("traces/5f3a-rank-2.123.pt.trace.json.gz", 2),
        # vLLM frontend
        ("myhost_1234.async_llm.123.pt.trace.json.gz", None),
        ("step2_myhost_1234.async_llm.123.pt.trace.json.gz", None),
        # SGLang
        ("1712345678.123-TP-3.trace.json.gz", 3),
        ("1712345678.123-TP-1-EP-1.trace.json.gz", 1),
        ("1712345678.123-TP-0-PP-1.trace.json.gz", None),
        ("1712345678.123-TP-2-EXTEND.trace.json.gz", 2),
        ("1712345678.123-TP-2-DECODE.trace.json", 2),
        ("/out/sglang/1712345678.123-TP-3.trace.json.gz", 3),
        # unknown
        ("", None),
        ("trace.json.gz", None),
        ("rank3.pt.trace.json.gz", None),
        ("myrank3.123.pt.trace.json.gz", None),
        ("rank3.123.pt.trace.json.gz.tmp", None),
        ("rank3.123.nsys-rep", None),
        ("actor_update-actor_step3_rank2-of-8_node1_pid42_7.pt.trace.json.gz", None),
    ],
)
def test_engine_trace_local_rank(name: str, local_rank: int | None) -> None:
    assert engine_trace_local_rank(name) == local_rank


def test_engine_names_say_which_engine_wrote_them_and_what_they_carry() -> None:
    assert [names.engine for names in registered_trace_names()][:2] == ["vllm", "sglang"]  # the built-ins, first
    vllm = parse_engine_trace_name("out/step2_dp1_pp0_tp0_dcp0_ep0_rank1.123.pt.trace.json.gz")
    assert vllm is not None and (vllm.engine, vllm.dp, vllm.rank, vllm.step) == ("vllm", 1, 1, 2)
    assert (vllm.local_rank(), vllm.local_rank(ranks_per_dp_rank=2)) == (None, 3)
    frontend = parse_engine_trace_name("step2_node1_4242.async_llm.123.pt.trace.json.gz")
    assert frontend is not None and (frontend.engine, frontend.frontend, frontend.pid) == ("vllm", True, 4242)
    sglang = parse_engine_trace_name("step2-1712.5-TP-1-DP-1.trace.json.gz")
    assert sglang is not None and (sglang.engine, sglang.rank, sglang.step) == ("sglang", None, 2)  # GPU: mode-bound
    assert parse_engine_trace_name("notes.txt") is None
    assert trace_names("sglang").step("step2_1712.5-TP-1.trace.json.gz") is None  # SGLang joins with "-"
    with pytest.raises(ValueError, match="no engine named 'trtllm'; registered: vllm, sglang"):
        trace_names("trtllm")


def test_keep_engine_trace() -> None:
    keep = ranks_to_keep(2, (0, 5), False, 8, 2)  # replica 2 holds ranks 4 and 5; keep 5
    assert keep_engine_trace("rank1.123.pt.trace.json.gz", 2, 2, keep)
    assert not keep_engine_trace("rank0.123.pt.trace.json.gz", 2, 2, keep)  # TP peer: global rank 4
    assert keep_engine_trace("dir/5f3a-rank-1.123.pt.trace.json.gz", 2, 2, keep)
    assert not keep_engine_trace("dir/5f3a-rank-0.123.pt.trace.json.gz", 2, 2, keep)
    assert keep_engine_trace("1712345678.123-TP-1.trace.json.gz", 2, 2, keep)
    assert not keep_engine_trace("1712345678.123-TP-0.trace.json.gz", 2, 2, keep)
    # Names whose rank cannot be read are kept.
    assert keep_engine_trace("myhost_1234.async_llm.123.pt.trace.json.gz", 2, 2, keep)
    assert keep_engine_trace("1712345678.123-TP-0-PP-1.trace.json.gz", 2, 2, keep)
    assert keep_engine_trace("notes.txt", 2, 2, keep)
    assert keep_engine_trace("rank0.123.pt.trace.json.gz", 0, 2, [0])
    assert not keep_engine_trace("rank0.123.pt.trace.json.gz", 0, 2, [])
    # A local rank beyond the replica is a misread name: kept, not dropped.
    assert keep_engine_trace("rank2.123.pt.trace.json.gz", 0, 2, [0, 1])
    assert keep_engine_trace("1712345678.123-TP-7.trace.json.gz", 1, 4, [])


def test_engine_trace_rank() -> None:
    assert engine_trace_rank("step3_rank1.123.pt.trace.json.gz", 2, 2) == 5
    assert engine_trace_rank("1712345678.123-TP-1.trace.json.gz", 0, 4) == 1
    assert engine_trace_rank("dp1_pp0_tp0_dcp0_ep0_rank1.123.pt.trace.json.gz", 1, 4, ranks_per_dp_rank=2) == 7
    assert engine_trace_rank("myhost_1234.async_llm.123.pt.trace.json.gz", 2, 2) is None  # frontend
    assert engine_trace_rank("rank2.123.pt.trace.json.gz", 0, 2) is None  # outside the replica: misread

    # An engine with its own names brings its own parser; the rest stays the same.
    def by_suffix(filename: str, *, ranks_per_dp_rank: int | None = None) -> int | None:
        return int(filename.rsplit("gpu", 1)[1]) if "gpu" in filename else None

    assert engine_trace_rank("trace-gpu1", 3, 2, parse=by_suffix) == 7
    assert not keep_engine_trace("trace-gpu0", 3, 2, [7], parse=by_suffix)
    assert keep_engine_trace("notes", 3, 2, [], parse=by_suffix)
    # Bad arguments fail whatever the name says.
    with pytest.raises(ValueError, match="'replica' must be >= 0"):
        engine_trace_rank("notes.txt", -1, 2)
    with pytest.raises(TypeError, match="'gpus_per_replica' must be an int"):
        keep_engine_trace("notes.txt", 0, 2.0, [])  # type: ignore[arg-type]


# --- selection --------------------------------------------------------------------------------


def test_is_profiled_rank() -> None:
    assert is_profiled_rank(3, [1, 3])
    assert not is_profiled_rank(2, [1, 3])
    assert not is_profiled_rank(0, [])
    assert is_profiled_rank(2, [], all_ranks=True)
    assert is_profiled_rank(1, iter([0, 1]))


def test_profiled_ranks() -> None:
    assert profiled_ranks([3, 1, 3], False, 4) == (1, 3)
    assert profiled_ranks([], False, 4) == ()
    assert profiled_ranks([], True, 3) == (0, 1, 2)
    with pytest.raises(ValueError, match=r"'ranks' selects rank 4, outside the world of 4 ranks \(0\.\.3\)"):
        profiled_ranks([0, 4], False, 4)
    with pytest.raises(ValueError):
        profiled_ranks([], True, 0)


def test_validate_ranks() -> None:
    validate_ranks([0, 7], 8)
    validate_ranks([], 1)
    with pytest.raises(ValueError, match=r"'ranks' selects rank 8, outside the world of 8 ranks \(0\.\.7\)"):
        validate_ranks([1, 8], 8)
    with pytest.raises(ValueError, match="'profile_ranks' must be >= 0: -1"):
        validate_ranks([-1], 8, field="profile_ranks")
    with pytest.raises(TypeError, match="'ranks' must be an int: True"):
        validate_ranks([True], 8)
    with pytest.raises(ValueError, match="'world_size' must be >= 1"):
        validate_ranks([0], 0)
