"""What the finish hook sees in ``save_path``: published files only, no SDK scratch folder (issue 27)."""

from __future__ import annotations

from pathlib import Path

import pytest

import instrument as ins
from instrument.naming import SCRATCH_PREFIX
from instrument.recorders._publish import Finisher

torch = pytest.importorskip("torch")


def _listing_hook(listing: Path) -> ins.FinishHook:
    return ins.FinishHook(cmd=f'ls -A "$INSTRUMENT_PROFILE_SAVE_PATH" > "{listing}"', timeout_s=60, output="log")


@pytest.mark.parametrize("ends_by", ["the last configured step", "last=True", "finish()"])
def test_the_hook_sees_no_scratch_folder(tmp_path: Path, ends_by: str) -> None:
    save, listing = tmp_path / "profile", tmp_path / "listing.txt"
    steps = (1, 2) if ends_by == "the last configured step" else None
    config = ins.ProfilerConfig(
        save_path=str(save),
        contents=("cpu",),
        steps=steps,
        schedule=ins.Schedule(active=1),
        finish_hook=_listing_hook(listing),
    )
    run = ins.configure(config, role="actor", rank=0)
    for step in (1, 2):
        last = ends_by == "last=True" and step == 2
        with ins.profile_step(step, last=last), ins.profiled_stage("update_actor", scheduled=True):
            for i in range(2):
                with ins.profile_window(mini_batch=i):
                    torch.randn(4, 4) @ torch.randn(4, 4)
    assert listing.is_file() == (ends_by != "finish()")  # the hook ran at the end of the last step, or not yet
    ins.finish()
    assert run.failures == 0
    seen = listing.read_text().split()
    assert [n for n in seen if n.endswith(".pt.trace.json.gz")], seen
    assert not [n for n in seen if n.startswith(SCRATCH_PREFIX)], seen
    assert not [p for p in save.iterdir() if p.name.startswith(SCRATCH_PREFIX)]


def test_a_flushed_finisher_makes_its_folder_again_but_never_save_path(tmp_path: Path) -> None:
    finished: list[Path] = []
    finisher = Finisher(finished.append, lambda what, exc: None, what="finish", name="test-finisher")
    save = tmp_path / "save"
    first = finisher.folder(str(save))
    assert first.is_dir() and first.parent == save
    finisher.flush()
    assert not first.exists()  # empty: removed
    second = finisher.folder(str(save))
    assert second.is_dir()
    (second / "kept").write_text("a failure's leftover")
    finisher.flush()
    assert second.is_dir() and finisher.folder(str(save)) == second  # not empty: kept and still used
    (second / "kept").unlink()
    finisher.flush()
    save.rmdir()
    with pytest.raises(FileNotFoundError):
        finisher.folder(str(save))  # a save_path removed under the run is not made again
    assert not save.exists()
    finisher.close()
