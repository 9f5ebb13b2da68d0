"""Tests for ``instrument.naming``: trace names are safe, unique and parse back exactly."""

from __future__ import annotations

import os
import re
import sys
import threading
from types import SimpleNamespace

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from instrument import naming
from instrument.naming import (
    LABEL_MAX_LEN,
    TRACE_SUFFIX,
    TraceName,
    next_timestamp_ns,
    parse_trace_name,
    sanitize_label,
    short_hostname,
    trace_basename,
)

HOSTILE = [
    "../etc",
    "..",
    ".",
    "a_b",
    "x/y",
    "/abs/path",
    "$(rm -rf /)",
    "`id`",
    "a;b|c",
    "a&&b > c",
    "...",
    ".hidden.",
    "a..b",
    "naïve-ünïcode-日本",
    "with spaces\tand\ttabs",
    "new\nline",
    "nul\x00byte",
    "x" * 200,
    "." * 70 + "y" * 70,
    "mb3",
    "partial",
    "step2",
    "pid7",
    "rank0-of-1",
]

labels = st.one_of(st.text(), st.sampled_from(HOSTILE), st.text(min_size=LABEL_MAX_LEN + 1, max_size=300))
naturals = st.integers(min_value=0, max_value=2**64)
SAFE = re.compile(r"[A-Za-z0-9.=+-]+")


@st.composite
def name_fields(draw: st.DrawFn) -> dict[str, object]:
    """Keyword arguments that ``trace_basename`` accepts, labels not yet sanitised."""
    world_size = draw(st.integers(min_value=1, max_value=4096))
    window = draw(st.none() | st.tuples(naturals, naturals).map(lambda pair: tuple(sorted(pair))))
    return {
        "role": draw(labels),
        "stage": draw(labels),
        "host": draw(labels),
        "step": draw(naturals),
        "rank": draw(st.integers(min_value=0, max_value=world_size - 1)),
        "world_size": world_size,
        "pid": draw(naturals),
        "timestamp_ns": draw(naturals),
        "window": window,
        "partial": window is not None and draw(st.booleans()),
        "triggered": draw(st.booleans()),
    }


def _usable(label: str) -> bool:
    try:
        sanitize_label(label)
    except ValueError:
        return False
    return True


def _keywords(**overrides: object) -> dict[str, object]:
    kw: dict[str, object] = {
        "role": "actor",
        "stage": "update_actor",
        "step": 3,
        "rank": 2,
        "world_size": 8,
        "host": "node1",
        "pid": 42,
        "timestamp_ns": 7,
    }
    kw.update(overrides)
    return kw


# --- round trip -------------------------------------------------------------------------------


@given(name_fields())
def test_parse_inverts_basename(kw: dict[str, object]) -> None:
    if not all(_usable(kw[field]) for field in ("role", "stage", "host")):  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="no character usable"):
            trace_basename(**kw)  # type: ignore[arg-type]
        return
    expected = TraceName(**{**kw, **{f: sanitize_label(kw[f]) for f in ("role", "stage", "host")}})  # type: ignore[arg-type]
    name = trace_basename(**kw)  # type: ignore[arg-type]
    assert parse_trace_name(name) == expected
    assert parse_trace_name(name + TRACE_SUFFIX) == expected
    assert parse_trace_name(os.path.join("/some/dir", name + TRACE_SUFFIX)) == expected
    assert expected.basename() == name


@given(st.sampled_from(["role", "stage", "host"]), st.text(alphabet=".", max_size=100))
def test_unusable_label_is_rejected(field: str, label: str) -> None:
    with pytest.raises(ValueError, match="no character usable"):
        sanitize_label(label)
    with pytest.raises(ValueError, match="no character usable"):
        trace_basename(**_keywords(**{field: label}))  # type: ignore[arg-type]


# Raw name fields, valid or not, to check the inverse direction.
raw_labels = st.one_of(
    st.from_regex(r"[A-Za-z0-9=+-]{1,12}(\.[A-Za-z0-9=+-]{1,12}){0,3}", fullmatch=True),  # valid
    st.from_regex(r"[A-Za-z0-9.=+-]{1,70}", fullmatch=True),  # often invalid: edge dots, "..", too long
    st.sampled_from(["mb3", "mb0-1", "partial", "pid7", "step2", "rank0-of-1", "a.b", ".a", "a.", "a..b"]),
    st.sampled_from(["x" * LABEL_MAX_LEN, "x" * (LABEL_MAX_LEN + 1)]),
)
raw_ints = st.one_of(
    st.integers(min_value=0, max_value=10**20).map(str),
    st.integers(min_value=0, max_value=50).map(str),
    st.from_regex(r"0[0-9]{1,3}", fullmatch=True),  # leading zero: never written
)


def _valid_label(text: str) -> bool:
    return (
        SAFE.fullmatch(text) is not None
        and ".." not in text
        and not text.startswith(".")
        and not text.endswith(".")
        and len(text) <= LABEL_MAX_LEN
    )


def _valid_int(text: str) -> bool:
    return text == "0" or not text.startswith("0")


@st.composite
def raw_names(draw: st.DrawFn) -> tuple[str, bool]:
    """A candidate trace name and whether it is one that ``trace_basename`` could write."""
    role, stage, host = draw(raw_labels), draw(raw_labels), draw(raw_labels)
    step, rank, pid, timestamp = draw(raw_ints), draw(raw_ints), draw(raw_ints), draw(raw_ints)
    world = draw(st.one_of(st.integers(min_value=1, max_value=300).map(lambda d: str(int(rank) + d)), raw_ints))
    window = ""
    ok_window = True
    if draw(st.booleans()):
        first = draw(raw_ints)
        window = f"_mb{first}"
        ok_window = _valid_int(first)
        if draw(st.booleans()):
            last = draw(st.one_of(raw_ints, st.just(first)))
            window += f"-{last}"
            ok_window = ok_window and _valid_int(last) and int(last) > int(first)
        if draw(st.booleans()):
            window += "_partial"
    if draw(st.booleans()):
        window += "_trig"
    name = f"{role}_{stage}_step{step}_rank{rank}-of-{world}{window}_{host}_pid{pid}_{timestamp}"
    valid = (
        all(_valid_label(label) for label in (role, stage, host))
        and all(_valid_int(number) for number in (step, rank, world, pid, timestamp))
        and int(world) >= 1
        and int(rank) < int(world)
        and ok_window
    )
    return name, valid


@given(raw_names())
def test_basename_inverts_parse(case: tuple[str, bool]) -> None:
    name, valid = case
    parsed = parse_trace_name(name)
    assert (parsed is not None) == valid, name
    if parsed is not None:
        assert parsed.basename() == name


# --- label safety -----------------------------------------------------------------------------


@given(labels)
def test_sanitized_label_is_safe_and_idempotent(label: str) -> None:
    assume(_usable(label))
    safe = sanitize_label(label)
    assert SAFE.fullmatch(safe)
    assert ".." not in safe
    assert not safe.startswith(".")
    assert not safe.endswith(".")
    assert "/" not in safe
    assert "_" not in safe
    assert 1 <= len(safe) <= LABEL_MAX_LEN
    assert sanitize_label(safe) == safe


def test_sanitize_label_examples() -> None:
    assert sanitize_label("update_actor") == "update-actor"
    assert sanitize_label("../etc") == "-etc"
    assert sanitize_label("x/y") == "x-y"
    assert sanitize_label("a..b...c") == "a.b.c"
    assert sanitize_label("..hidden..") == "hidden"
    assert sanitize_label("$(rm -rf /)") == "--rm--rf---"
    assert sanitize_label("tp=2+dp") == "tp=2+dp"
    assert sanitize_label("x" * 100) == "x" * LABEL_MAX_LEN
    with pytest.raises(TypeError):
        sanitize_label(3)  # type: ignore[arg-type]


def test_short_hostname_is_a_safe_label() -> None:
    assert sanitize_label(short_hostname()) == short_hostname()


@given(name_fields())
def test_trace_file_stays_inside_directory(kw: dict[str, object]) -> None:
    assume(all(_usable(kw[field]) for field in ("role", "stage", "host")))  # type: ignore[arg-type]
    directory = "/save/path"
    file_name = trace_basename(**kw) + TRACE_SUFFIX  # type: ignore[arg-type]
    assert os.path.basename(file_name) == file_name
    path = os.path.normpath(os.path.join(directory, file_name))
    assert os.path.dirname(path) == directory
    assert os.path.commonpath([directory, path]) == directory


def test_longest_labels_fit_a_file_name() -> None:
    # LABEL_MAX_LEN promises "a name stays far below the 255-byte file name limit".
    name = trace_basename(
        role="r" * 100,
        stage="s" * 100,
        host="h" * 100,
        step=1_000_000,
        rank=99_999,
        world_size=100_000,
        pid=4194304,
        timestamp_ns=1_712_345_678_901_234_567,
        window=(999_999, 1_000_000),
        partial=True,
    )
    assert len((name + TRACE_SUFFIX).encode()) <= 255


# --- uniqueness -------------------------------------------------------------------------------


def test_default_timestamps_never_collide_in_one_process() -> None:
    names = [
        trace_basename(role="actor", stage="s", step=step, rank=rank, world_size=4, host=host, pid=pid)
        for host in ("node1", "node2")
        for pid in (1, 2)
        for rank in range(4)
        for step in range(60)
    ]
    assert len(set(names)) == len(names) == 960
    # Identical fields: only the timestamp tells them apart.
    same = [trace_basename(role="actor", stage="s", step=1, rank=0, world_size=1) for _ in range(2000)]
    assert len(set(same)) == len(same)
    stamps = [parse_trace_name(n).timestamp_ns for n in names + same]  # type: ignore[union-attr]
    assert stamps == sorted(set(stamps))


def test_names_never_repeat_when_the_clock_stalls_or_goes_back(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter([5_000, 5_000, 5_000, 4_000, 4_000, 9_000, 9_000])
    monkeypatch.setattr(naming, "time", SimpleNamespace(time_ns=lambda: next(readings)))
    monkeypatch.setattr(naming, "_last_timestamp_ns", 0)
    stamps = [next_timestamp_ns() for _ in range(7)]
    assert stamps == [5_000, 5_001, 5_002, 5_003, 5_004, 9_000, 9_001]
    assert stamps == sorted(set(stamps))


def test_next_timestamp_ns_unique_across_threads_with_a_stalled_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    # A clock that never advances and frequent thread switches expose an unlocked read-modify-write.
    monkeypatch.setattr(naming, "time", SimpleNamespace(time_ns=lambda: 1))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        test_next_timestamp_ns_unique_across_threads()
    finally:
        sys.setswitchinterval(interval)


def test_default_host_and_pid_are_this_process() -> None:
    parsed = parse_trace_name(trace_basename(role="r", stage="s", step=0, rank=0, world_size=1))
    assert parsed is not None
    assert parsed.host == short_hostname()
    assert parsed.pid == os.getpid()


def test_next_timestamp_ns_unique_across_threads() -> None:
    per_thread = 5000
    results: list[list[int]] = [[] for _ in range(8)]
    barrier = threading.Barrier(len(results))

    def work(out: list[int]) -> None:
        barrier.wait()
        out.extend(next_timestamp_ns() for _ in range(per_thread))

    threads = [threading.Thread(target=work, args=(out,)) for out in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    flat = [stamp for out in results for stamp in out]
    assert len(flat) == len(set(flat)) == per_thread * len(results)
    for out in results:
        assert out == sorted(set(out))


# --- format examples --------------------------------------------------------------------------


def test_exact_format() -> None:
    assert (
        trace_basename(**_keywords(window=(0, 1)))  # type: ignore[arg-type]
        == "actor_update-actor_step3_rank2-of-8_mb0-1_node1_pid42_7"
    )
    assert trace_basename(**_keywords()) == "actor_update-actor_step3_rank2-of-8_node1_pid42_7"  # type: ignore[arg-type]


def test_single_minibatch_window_and_partial() -> None:
    assert "_rank2-of-8_mb3_node1_" in trace_basename(**_keywords(window=(3, 3)))  # type: ignore[arg-type]
    name = trace_basename(**_keywords(window=(2, 5), partial=True))  # type: ignore[arg-type]
    assert name == "actor_update-actor_step3_rank2-of-8_mb2-5_partial_node1_pid42_7"
    parsed = parse_trace_name(name)
    assert parsed is not None
    assert parsed.window == (2, 5)
    assert parsed.partial


def test_parse_with_suffix_and_directory() -> None:
    name = "actor_update-actor_step3_rank2-of-8_mb3_node1_pid42_7"
    expected = TraceName(
        role="actor",
        stage="update-actor",
        step=3,
        rank=2,
        world_size=8,
        host="node1",
        pid=42,
        timestamp_ns=7,
        window=(3, 3),
    )
    assert parse_trace_name(name) == expected
    assert parse_trace_name(name + ".pt.trace.json.gz") == expected
    assert parse_trace_name("/data/run1/" + name + ".pt.trace.json.gz") == expected
    assert parse_trace_name("relative/dir/" + name + ".pt.trace.json") == expected


@pytest.mark.parametrize(
    "name",
    [
        "",
        "garbage",
        "actor_update_step3",
        "actor_update-actor_step3_rank2-of-8_mb3-3_node1_pid42_7",  # never written
        "actor_update-actor_step3_rank2-of-8_mb4-3_node1_pid42_7",
        "actor_update-actor_step3_rank8-of-8_node1_pid42_7",  # rank >= world
        "actor_update-actor_step3_rank0-of-0_node1_pid42_7",
        "actor_update-actor_step03_rank2-of-8_node1_pid42_7",  # leading zeros
        "actor_update-actor_step3_rank02-of-8_node1_pid42_7",
        "actor_update-actor_step3_rank2-of-08_node1_pid42_7",
        "actor_update-actor_step3_rank2-of-8_mb01_node1_pid42_7",
        "actor_update-actor_step3_rank2-of-8_node1_pid042_7",
        "actor_update-actor_step3_rank2-of-8_node1_pid42_07",
        "actor_update-actor_step3_rank2-of-8_partial_node1_pid42_7",  # partial without window
        "actor_update-actor_step-3_rank2-of-8_node1_pid42_7",
        "actor_..._step3_rank2-of-8_node1_pid42_7",
        "actor_.stage_step3_rank2-of-8_node1_pid42_7",
        "actor_update-actor_step3_rank2-of-8_" + "h" * (LABEL_MAX_LEN + 1) + "_pid42_7",
        "rank0.123.pt.trace.json.gz",  # a vLLM engine trace
        "1712345678.123-TP-3.trace.json.gz",  # an SGLang engine trace
    ],
)
def test_parse_rejects(name: str) -> None:
    assert parse_trace_name(name) is None


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"rank": 8}, ValueError),
        ({"rank": 9}, ValueError),
        ({"rank": -1}, ValueError),
        ({"step": -1}, ValueError),
        ({"world_size": 0, "rank": 0}, ValueError),
        ({"pid": -1}, ValueError),
        ({"timestamp_ns": -1}, ValueError),
        ({"partial": True}, ValueError),
        ({"window": (3, 2)}, ValueError),
        ({"window": (-1, 2)}, ValueError),
        ({"step": True}, TypeError),
        ({"rank": False}, TypeError),
        ({"world_size": True, "rank": 0}, TypeError),
        ({"pid": True}, TypeError),
        ({"timestamp_ns": False}, TypeError),
        ({"window": (True, 2)}, TypeError),
        ({"step": 1.0}, TypeError),
        ({"step": "3"}, TypeError),
        ({"role": None}, TypeError),
    ],
)
def test_invalid_fields_raise(overrides: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        trace_basename(**_keywords(**overrides))  # type: ignore[arg-type]


def test_error_messages_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"'rank' must be < world_size \(8\): 8"):
        trace_basename(**_keywords(rank=8))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'step' must be >= 0"):
        trace_basename(**_keywords(step=-1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'partial' needs a 'window'"):
        trace_basename(**_keywords(partial=True))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'step' must be an int: True"):
        trace_basename(**_keywords(step=True))  # type: ignore[arg-type]
