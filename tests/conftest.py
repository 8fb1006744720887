"""Shared fixtures: one local Ray cluster per test run (a Ray start costs 20-40 s on 2 cores)."""

pytest_plugins = ["tests.fixtures.ray_cluster", "tests.fixtures.games", "tests.fixtures.model"]
