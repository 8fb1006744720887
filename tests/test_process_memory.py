"""Resident memory and the actors' allocator (process_memory.py, placement.*_allocator): what keeps
long CPU runs from growing until Ray's out-of-memory killer ends them."""

from __future__ import annotations

import logging
import mmap
import os

import pytest

from selective_rollout.config import load_config
from selective_rollout.config.placement import PlacementConfig
from selective_rollout.process_memory import (
    GB,
    in_fresh_process,
    jemalloc_library,
    resident_bytes,
    resident_gb,
)

MB = 1024 * 1024


def touched_growth(size: int) -> int:
    """Resident growth from writing every page of ``size`` bytes of fresh anonymous memory (fresh
    pages, so the growth is there whatever the heap already holds: in a long test session freed
    heap pages stay resident, and a new allocation may reuse them)."""
    before = resident_bytes()
    block = mmap.mmap(-1, size)
    for offset in range(0, size, mmap.PAGESIZE):
        block[offset] = 1
    grown = resident_bytes() - before
    block.close()
    return grown


def test_resident_bytes_counts_memory_this_process_touches():
    # half of it at least: resident size also counts file-backed pages (libraries), which the
    # kernel may drop meanwhile on a machine that other processes load (a CI run saw 149 of 200 MB)
    assert touched_growth(200 * MB) > 100 * MB
    assert 0.01 < resident_gb() < 100
    assert resident_gb() == pytest.approx(resident_bytes() / GB, rel=0.05)


def test_by_default_only_the_learner_runs_on_jemalloc():
    """The learner is as fast on jemalloc and holds less (bench/learner_step.py --only allocator);
    the engine keeps glibc's speed, the coordinator (and its env workers) are light."""
    place = load_config(None, []).placement
    preload = {"env_vars": {"LD_PRELOAD": str(jemalloc_library())}}
    assert (place.engine_allocator, place.learner_allocator, place.coordinator_allocator) == (
        "system",
        "auto",
        "system",
    )
    assert place.learner_options(local=True)["runtime_env"] == preload
    assert place.engine_options(local=True) == {} and place.coordinator_options(local=True) == {}
    assert "runtime_env" not in place.env_worker_options()
    # on a joined cluster the nodes' Ray may live at other paths than the driver's: auto is glibc
    assert "runtime_env" not in place.learner_options(local=False)


def test_jemalloc_is_preloaded_in_every_heavy_actor_beside_its_resources():
    place = PlacementConfig(
        engine_allocator="jemalloc", coordinator_allocator="jemalloc", engine_resources={"gpu_node": 1.0}
    )
    preload = {"env_vars": {"LD_PRELOAD": str(jemalloc_library())}}
    assert jemalloc_library().is_file()  # the copy in Ray's wheel, so on every Ray node
    assert place.engine_options() == {"resources": {"gpu_node": 1.0}, "runtime_env": preload}
    assert place.learner_options(local=True)["runtime_env"] == preload
    assert place.learner_options()["num_cpus"] == 1.0
    assert place.coordinator_options() == {"runtime_env": preload}
    assert "runtime_env" not in place.env_worker_options()  # light: they keep the system's
    assert "runtime_env" not in PlacementConfig(learner_allocator="system").learner_options(local=True)


def test_a_missing_jemalloc_is_refused_by_name_unless_auto(monkeypatch):
    import selective_rollout.process_memory as process_memory

    monkeypatch.setattr(process_memory, "jemalloc_library", lambda: None)
    with pytest.raises(ValueError, match=r"placement\.\*_allocator.*libjemalloc\.so.*system or auto"):
        PlacementConfig(engine_allocator="jemalloc").engine_options()
    assert "runtime_env" not in PlacementConfig().learner_options(local=True)  # auto: the system's malloc


@pytest.mark.ray
def test_an_actor_started_with_the_options_runs_on_jemalloc(ray_cluster):
    import ray

    @ray.remote(num_cpus=0.1)
    class Probe:
        def allocator_libraries(self) -> list[str]:
            with open("/proc/self/maps") as maps:
                return sorted({line.split()[-1] for line in maps if "malloc" in line.split()[-1]})

    options = PlacementConfig(coordinator_allocator="jemalloc").coordinator_options()
    on_jemalloc, on_system = Probe.options(**options).remote(), Probe.remote()
    try:
        assert ray.get(on_jemalloc.allocator_libraries.remote(), timeout=120) == [str(jemalloc_library())]
        assert ray.get(on_system.allocator_libraries.remote(), timeout=120) == []
    finally:
        ray.kill(on_jemalloc)
        ray.kill(on_system)


def grow_and_log(size: int) -> tuple[int, int]:
    """Runs in the fresh process: holds ``size`` touched bytes while it logs, returns its pid."""
    block = bytearray(os.urandom(1)) * size  # every page written
    logging.getLogger("selective_rollout.sft").info("fine-tuned in process %d", os.getpid())
    return os.getpid(), len(block)


def refuse(reason: str) -> None:
    raise ValueError(reason)


def die() -> None:
    os._exit(3)


def test_work_in_a_fresh_process_answers_here_and_leaves_its_memory_there(caplog):
    caplog.set_level(logging.INFO)
    before = resident_bytes()
    pid, size = in_fresh_process(grow_and_log, 300 * MB)
    assert pid != os.getpid() and size == 300 * MB
    assert resident_bytes() - before < 100 * MB  # the 300 MB lived and died with that process
    assert f"fine-tuned in process {pid}" in caplog.text  # its log, through this process's handlers


def test_a_fresh_process_raises_its_error_here_and_its_death_is_named():
    with pytest.raises(ValueError, match="no walkthroughs in data/games"):
        in_fresh_process(refuse, "no walkthroughs in data/games")
    with pytest.raises(RuntimeError, match="die: its process ended without an answer"):
        in_fresh_process(die)
