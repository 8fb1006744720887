"""Resident memory and the actors' allocator (process_memory.py, placement.allocator): what keeps
long CPU runs from growing until Ray's out-of-memory killer ends them."""

from __future__ import annotations

import mmap

import pytest

from selective_rollout.config import load_config
from selective_rollout.config.placement import PlacementConfig
from selective_rollout.process_memory import GB, jemalloc_library, resident_bytes, resident_gb


def test_resident_bytes_counts_memory_this_process_touches():
    """Fresh anonymous pages, so the growth is there whatever the heap already holds (in a long test
    session freed heap pages stay resident, and a new allocation may reuse them)."""
    size = 200 * 1024 * 1024
    before = resident_bytes()
    block = mmap.mmap(-1, size)
    for offset in range(0, size, mmap.PAGESIZE):
        block[offset] = 1  # every page written
    grown = resident_bytes() - before
    block.close()
    assert grown > 150 * 1024 * 1024
    assert 0.01 < resident_gb() < 100
    assert resident_gb() == pytest.approx(resident_bytes() / GB, rel=0.05)


def test_system_allocator_adds_nothing_to_the_actor_options():
    place = load_config(None, []).placement
    assert place.allocator == "system"
    assert place.process_options() == {}
    assert "runtime_env" not in place.learner_options()
    assert place.engine_options() == {} and place.coordinator_options() == {}


def test_jemalloc_is_preloaded_in_every_heavy_actor_beside_its_resources():
    place = PlacementConfig(allocator="jemalloc", engine_resources={"gpu_node": 1.0})
    preload = {"env_vars": {"LD_PRELOAD": str(jemalloc_library())}}
    assert jemalloc_library().is_file()  # the copy in Ray's wheel, so on every Ray node
    assert place.engine_options() == {"resources": {"gpu_node": 1.0}, "runtime_env": preload}
    assert place.learner_options()["runtime_env"] == preload
    assert place.learner_options()["num_cpus"] == 1.0
    assert place.coordinator_options() == {"runtime_env": preload}
    assert "runtime_env" not in place.env_worker_options()  # light: they keep the system's


def test_a_missing_jemalloc_is_refused_by_name(monkeypatch):
    import selective_rollout.process_memory as process_memory

    monkeypatch.setattr(process_memory, "jemalloc_library", lambda: None)
    with pytest.raises(ValueError, match=r"placement\.allocator=jemalloc.*libjemalloc\.so.*allocator=system"):
        PlacementConfig(allocator="jemalloc").engine_options()


@pytest.mark.ray
def test_an_actor_started_with_the_options_runs_on_jemalloc(ray_cluster):
    import ray

    @ray.remote(num_cpus=0.1)
    class Probe:
        def allocator_libraries(self) -> list[str]:
            with open("/proc/self/maps") as maps:
                return sorted({line.split()[-1] for line in maps if "malloc" in line.split()[-1]})

    options = PlacementConfig(allocator="jemalloc").coordinator_options()
    on_jemalloc, on_system = Probe.options(**options).remote(), Probe.remote()
    try:
        assert ray.get(on_jemalloc.allocator_libraries.remote(), timeout=120) == [str(jemalloc_library())]
        assert ray.get(on_system.allocator_libraries.remote(), timeout=120) == []
    finally:
        ray.kill(on_jemalloc)
        ray.kill(on_system)
