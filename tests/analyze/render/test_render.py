"""What ``instrument analyze`` shows: words and plurals, ``-`` for what a trace does not hold, a
straggler ratio that can be checked from its row, the clock caveat only across hosts, stable stage
colours, the one-rank picture, and pictures and pages written whole, never through a symlink.

Traces are built with known durations (:func:`tests.analyze.test_analyze.known_run`, no clock is read) or are
the committed real GPU traces of ``tests/data/hta``.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from instrument import cli
from instrument.analyze import Report, analyze, render_text, write_html, write_png
from instrument.analyze.render import UnsafeDestinationError
from instrument.analyze.render import _png as picture
from instrument.analyze.render import _tables as tables
from instrument.analyze.render._destination import write_new_file
from instrument.analyze.render._words import plural
from tests.analyze.test_analyze import known_run
from tests.analyze.traces.test_steps import STRAGGLER, _torch_set

HTA_DATA = Path(__file__).parents[2] / "data" / "hta"


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return analyze(known_run(tmp_path_factory.mktemp("one") / "p", world=1, steps=1), jobs=1)


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return analyze(known_run(tmp_path_factory.mktemp("two") / "p", hosts=("node-a", "node-b")), jobs=1)


@pytest.fixture(scope="module")
def one_host(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return analyze(known_run(tmp_path_factory.mktemp("same") / "p"), jobs=1)


def _row(report: Report, stage: str) -> dict[str, str]:
    rows = tables.table_rows(report)
    found = next(r for r in rows if r[2].split(" [")[0] == stage)
    return dict(zip(tables.headers(report), found, strict=True))


# --------------------------------------------------------------------------- words


def test_one_rank_is_singular_and_has_no_straggler_columns(one_rank: Report) -> None:
    text = render_text(one_rank)
    assert re.search(r"\b1 rank;", text) and "1 ranks" not in text
    assert "1 step," in text and "1 steps" not in text
    assert "slowest: the straggler rank" not in text  # no column to explain
    row = _row(one_rank, "generate_sequences")
    assert "slowest" not in row and "max/med" not in row  # columns of "-" only take room
    assert (row["ranks"], row["median ms"], row["max ms"]) == ("1", "15.0", "15.0")


def test_plural_words() -> None:
    assert [plural(n, "rank") for n in (0, 1, 2, 1234)] == ["0 ranks", "1 rank", "2 ranks", "1,234 ranks"]
    assert plural(1, "process", "processes") == "1 process"
    assert plural(3, "process", "processes") == "3 processes"


def test_rows_without_mini_batches_show_a_dash(one_host: Report) -> None:
    assert _row(one_host, "compute_log_prob")["mini-batch ms"] == "-"
    assert _row(one_host, "update_actor")["mini-batch ms"] == "8.00"
    assert "gpu ms" not in tables.headers(one_host)  # no kernels anywhere: no column of "-"
    assert all("0.00" not in cell for row in tables.table_rows(one_host) for cell in row)


def test_several_ranks_keep_the_straggler_columns(one_host: Report) -> None:
    row = _row(one_host, "generate_sequences")
    assert (row["ranks"], row["slowest"], row["max/med"], row["max ms"]) == ("3", "2", "6.00", "90.0")
    text = render_text(one_host)
    assert "3 ranks;" in text and "slowest: the straggler rank" in text


# --------------------------------------------------------------------------- the ratio, checked from its row


@pytest.fixture(scope="module")
def real_gpu() -> Report:
    return analyze(HTA_DATA / "trace_filter", jobs=1)


def _f(cell: str) -> float:
    return float(cell.replace(",", ""))


def _check_ratios(report: Report) -> int:
    """Every compared row's max/med, recomputed from the figures on that row; returns rows judged by work."""
    by_work = 0
    for row in (dict(zip(tables.headers(report), r, strict=True)) for r in tables.table_rows(report)):
        if row["max/med"] == "-":
            continue
        if row.get("work med ms", "-") != "-":
            top, median = _f(row["work max ms"]), _f(row["work med ms"])
            by_work += 1
        else:
            top, median = _f(row["max ms"]), _f(row["median ms"])
        # the cells are rounded to 3 significant figures: half a unit of the last digit each
        assert top / median == pytest.approx(_f(row["max/med"]), rel=0.02, abs=0.006), row
    return by_work


def test_a_ratio_judged_by_work_shows_the_work_it_was_computed_from(real_gpu: Report) -> None:
    # HTA's trace_filter, step 552 data_load: wall 3.83 / 3.85 ms on the two ranks. The NCCL kernels running
    # beside it on the GPU are no wait on the CPU (they once made it 2.00x), and a stage under 1% of its
    # step names no straggler.
    row = next(
        dict(zip(tables.headers(real_gpu), r, strict=True))
        for r, s in zip(tables.table_rows(real_gpu), real_gpu.stages, strict=True)
        if s.step == 552 and "data_load" in s.stage
    )
    assert (row["median ms"], row["max ms"], row["max/med"], row["slowest"]) == ("3.83", "3.85", "1.01", "-")
    assert (row["work med ms"], row["work max ms"], row["lost ms"]) == ("-", "-", "-")
    assert _check_ratios(real_gpu) > 0  # the rows with NCCL calls on the CPU: judged by work, and checkable


def test_every_ratio_can_be_checked_from_its_row(real_gpu: Report, one_host: Report, tmp_path: Path) -> None:
    torch_set = analyze(_torch_set(tmp_path / "torch"), jobs=1)  # a straggler behind a barrier
    assert _check_ratios(torch_set) > 0
    gen = next(s for s in torch_set.stages if s.stage == "generate_sequences" and s.step == 1)
    assert gen.straggler == str(STRAGGLER) and gen.ratio is not None
    assert gen.max_ms / gen.median_ms < gen.ratio  # the wall figures alone could not explain the ratio
    assert _check_ratios(one_host) == 0  # judged by wall time: no work columns at all
    assert "work med ms" not in tables.headers(one_host)
    assert "by work" not in render_text(one_host)
    assert "work max / work med" in render_text(real_gpu)  # the legend says which pair the ratio divides


def test_the_page_shows_the_work_columns_and_the_same_cells(real_gpu: Report, tmp_path: Path) -> None:
    page = write_html(real_gpu, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "<th>work med ms</th><th>work max ms</th>" in page
    first = tables.table_rows(real_gpu)[0]
    cells = "".join(f'<td class="n">{c}</td>' for c in first[3:])
    assert cells in page


def test_the_heatmap_boxes_the_rank_the_table_names(real_gpu: Report) -> None:
    fig = picture._figure(real_gpu)
    top = fig.axes[0]
    assert "stage work per rank" in top.get_title()
    rows, _, columns, _ = picture._heatmap_rows(real_gpu, judged=True)
    boxed = {rows[round(p.get_y() + 0.5)]: columns[round(p.get_x() + 0.5)] for p in top.patches}
    by_row = {f"step {s.step}  {s.stage}": s for s in real_gpu.stages}
    assert boxed  # step 551's data_load at least (7.59 / 11.3 ms)
    for label, rank in boxed.items():
        assert by_row[label].straggler == rank, label
    assert "step 552  ## data_load ##" not in boxed  # under the floor: no straggler to box


# --------------------------------------------------------------------------- the clock caveat


def test_the_clock_caveat_only_when_traces_come_from_several_hosts(
    one_host: Report, two_hosts: Report, one_rank: Report, tmp_path: Path
) -> None:
    assert tables.hosts(one_host) == frozenset({"node-a"})
    assert tables.hosts(two_hosts) == frozenset({"node-a", "node-b"})
    assert tables.clock_caveat(one_host) is None
    assert tables.clock_caveat(one_rank) is None
    assert tables.clock_caveat(two_hosts) == two_hosts.caveat
    assert "not aligned" not in render_text(one_host)
    assert "not aligned" in render_text(two_hosts)
    page = tmp_path / "two.html"
    write_html(two_hosts, page)
    assert "not aligned" in page.read_text(encoding="utf-8")
    write_html(one_host, page)
    assert "not aligned" not in page.read_text(encoding="utf-8")


def test_names_that_give_no_host_keep_the_caveat_when_ranks_are_compared(one_host: Report, tmp_path: Path) -> None:
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for rank in range(2):  # torch's default worker names: no host the analyzer reads
        source = next(Path(p) for s in one_host.stages for r in s.ranks if r.rank == rank for p in r.files)
        (renamed / f"worker{rank}.1764000000.pt.trace.json.gz").write_bytes(source.read_bytes())
    report = analyze(renamed, jobs=1)
    assert report.ranks == (0, 1), report.skipped
    assert tables.hosts(report) is None
    assert tables.clock_caveat(report) == report.caveat


# --------------------------------------------------------------------------- colours


def test_a_stage_keeps_its_colour_whatever_else_is_in_the_report() -> None:
    alone = picture.stage_colors([("actor", "update_actor")])
    crowded = picture.stage_colors([("actor", s) for s in ("generate_sequences", "compute_values", "update_actor")])
    assert alone[("actor", "update_actor")] == crowded[("actor", "update_actor")]
    assert (
        picture.stage_colors([("actor", "update-actor")])[("actor", "update-actor")] == alone[("actor", "update_actor")]
    )
    reversed_order = picture.stage_colors(reversed(list(crowded)))
    assert reversed_order == crowded  # not from the order the stages come in


def test_stages_of_one_report_get_distinct_colours() -> None:
    names = [("actor", f"stage_{i}") for i in range(16)]
    assert len(set(picture.stage_colors(names).values())) == 16  # the palette holds sixteen
    both_roles = picture.stage_colors([("actor", "compute_log_prob"), ("ref", "compute_log_prob")])
    assert len(set(both_roles.values())) == 2


def test_the_page_shows_each_stage_in_its_picture_colour(one_host: Report, tmp_path: Path) -> None:
    page = write_html(one_host, tmp_path / "a.html").read_text(encoding="utf-8")
    colors = picture.stage_colors((s.role, s.stage) for s in one_host.stages)
    for (_, stage), color in colors.items():
        assert re.search(rf'background:{color}"></span>{stage}', page), stage


# --------------------------------------------------------------------------- the one-rank picture


def test_one_rank_draws_bars_not_a_one_column_heatmap(one_rank: Report, one_host: Report) -> None:
    fig = picture._figure(one_rank)
    top = fig.axes[0]
    assert "one rank (rank 0)" in top.get_title()
    assert len(top.patches) == len(one_rank.stages)  # one bar a stage
    assert not top.images  # no heatmap
    assert sorted(round(p.get_width(), 3) for p in top.patches) == [8.0, 15.0, 50.0]
    panels = [ax for ax in fig.axes if "step timeline" not in ax.get_title()]  # its traces' step timeline: (f)
    assert len(panels) == 2  # no colour bar for a ratio that is always 1
    several = picture._figure(one_host)
    assert several.axes[0].images and "straggler" in several.axes[0].get_title()


# --------------------------------------------------------------------------- writing files


@pytest.mark.parametrize("kind", ["png", "html"])
def test_a_planted_symlink_is_refused_and_its_target_untouched(one_rank: Report, tmp_path: Path, kind: str) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious", encoding="utf-8")
    link = tmp_path / f"out.{kind}"
    link.symlink_to(victim)
    write = write_png if kind == "png" else write_html
    with pytest.raises(UnsafeDestinationError, match="a symlink"):
        write(one_rank, link)
    assert victim.read_text(encoding="utf-8") == "precious"
    assert link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"out.{kind}", "victim.txt"]  # no temporary left


def test_the_cli_names_a_symlinked_destination_in_one_line(
    one_rank: Report, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious", encoding="utf-8")
    directory = os.path.dirname(one_rank.stages[0].ranks[0].files[0])
    for option in ("--png", "--html"):
        link = tmp_path / f"link{option}"
        link.symlink_to(victim)
        rc = cli.main(["analyze", directory, option, str(link), *(["--no-png"] if option == "--html" else [])])
        _, err = capsys.readouterr()
        assert rc == 2
        assert err.count("\n") == 1 and "a symlink" in err and "Traceback" not in err, err
    assert victim.read_text(encoding="utf-8") == "precious"


def test_a_fifo_or_directory_destination_is_refused_without_blocking(one_rank: Report, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    done: list[BaseException] = []
    writer = threading.Thread(target=lambda: _catch(done, lambda: write_png(one_rank, fifo)), daemon=True)
    writer.start()
    writer.join(60)  # guards against a hang only: opening a FIFO for writing would block for ever
    assert not writer.is_alive()
    assert isinstance(done[0], UnsafeDestinationError) and "a FIFO" in str(done[0])
    (tmp_path / "dir.html").mkdir()
    with pytest.raises(UnsafeDestinationError, match="a directory"):
        write_html(one_rank, tmp_path / "dir.html")


def _catch(into: list[BaseException], call: Callable[[], Any]) -> None:
    try:
        call()
    except BaseException as exc:  # handed to the test thread
        into.append(exc)


def test_an_old_file_is_replaced_whole(one_rank: Report, tmp_path: Path) -> None:
    target = tmp_path / "a.png"
    target.write_bytes(b"old picture, much longer than nothing" * 10_000)
    old_inode = target.stat().st_ino
    hard = tmp_path / "hard-link-to-old.png"
    os.link(target, hard)
    write_png(one_rank, target)
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert target.stat().st_ino != old_inode  # a new file renamed over the name, not written through it
    assert hard.read_bytes().startswith(b"old picture")  # another name of the old file keeps its bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "hard-link-to-old.png"]


def test_a_write_that_fails_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "missing-folder" / "a.png"
    with pytest.raises(FileNotFoundError):
        write_new_file(target, b"x")
    assert list(tmp_path.iterdir()) == []
