"""The tile schedulers (generator/schedulers.py, templates/_scheduler.cuh.j2): each family's
choice, the host grids, and that the device and bundle sides exist for every scheduler."""

from __future__ import annotations

import pytest

from flashgen.generator import schedulers
from flashgen.generator.families import FAMILIES
from flashgen.generator.render import environment, render
from flashgen.generator.schedulers import (
    SCHEDULERS,
    SINGLE_TILE,
    STATIC_PERSISTENT,
    VARLEN_PERSISTENT,
    Scheduler,
)
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec


def test_single_tile_grid_is_ceil_query_tiles_heads_batch() -> None:
    spec = KernelSpec(br=32)
    assert SINGLE_TILE.grid(spec, 3, 5, 1, 1, 132) == (1, 5, 3)
    assert SINGLE_TILE.grid(spec, 3, 5, 32, 7, 132) == (1, 5, 3)
    assert SINGLE_TILE.grid(spec, 3, 5, 33, 7, 0) == (2, 5, 3)
    assert SINGLE_TILE.grid(spec, 1, 1, 1000, 1000, 132) == (32, 1, 1)


def test_each_family_names_its_scheduler() -> None:
    assert FAMILIES["simt"].scheduler(KernelSpec(family="simt")) is SINGLE_TILE
    assert FAMILIES["mma"].scheduler(KernelSpec(family="mma", features=("gqapack",))) is SINGLE_TILE
    assert FAMILIES["wgmma"].scheduler(KernelSpec(family="wgmma", d=128)) is STATIC_PERSISTENT
    varlen = KernelSpec(family="wgmma", d=128, features=("varlen",))
    assert FAMILIES["wgmma"].scheduler(varlen) is VARLEN_PERSISTENT
    assert set(SCHEDULERS.values()) == {SINGLE_TILE, STATIC_PERSISTENT, VARLEN_PERSISTENT}


def test_persistent_threshold_is_read_at_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Experiments set it (scripts/dev/power_probe.py): a block per tile, or always persistent."""
    spec = KernelSpec(family="wgmma", d=128)  # 2048 tiles of 8 key tiles: persistent
    assert STATIC_PERSISTENT.grid(spec, 16, 16, 1024, 1024, 132) == (132, 1, 1)
    monkeypatch.setattr(schedulers, "PERSISTENT_MAX_KEY_TILES", -1)
    assert STATIC_PERSISTENT.grid(spec, 16, 16, 1024, 1024, 132) == (2048, 1, 1)
    assert STATIC_PERSISTENT.launch_constants() == (("double", "kPersistentMaxKeyTiles", "-1"),)


@pytest.mark.parametrize("scheduler", list(SCHEDULERS.values()), ids=list(SCHEDULERS))
def test_every_scheduler_has_its_device_and_launcher_macros(scheduler: Scheduler) -> None:
    module = environment().get_template("_scheduler.cuh.j2").module
    device = str(getattr(module, scheduler.macro)())
    assert "struct Work {" in device and "struct WorkList {" in device
    launcher = str(getattr(module, scheduler.launch_macro)(True))
    if scheduler is VARLEN_PERSISTENT:  # a cursor over the sequences; not bundled yet
        assert "bool next(int round, Work& w) {" in device
        assert "#error" in launcher
        return
    assert "bool next(int round, Work& w) const" in device
    assert "const dim3 grid(" in launcher
    for _, name, _ in scheduler.launch_constants():
        assert name in launcher


@pytest.mark.parametrize("family", list(FAMILIES))
def test_forward_kernels_include_their_scheduler(family: str) -> None:
    spec = shipped(family)[0]
    source = render(spec).source
    scheduler = spec.fam.scheduler(spec)
    assert f"the tile scheduler: {scheduler.name} " in source
    # the kernels take their work from it, not from blockIdx
    body = source[source.index('extern "C" __global__'):]
    if scheduler.persistent:
        assert "const WorkList work(tq, n_heads, n_batch);" in body
        assert body.count("work.next(round, w)") == 2  # the producer and the consumers
    else:
        assert "const Work work = block_work();" in body
    assert "blockIdx.y" not in body and "blockIdx.z" not in body
