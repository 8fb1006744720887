"""Launchers: ``ray job submit`` wrapper, cluster placement check, cluster files (see docs/cluster.md)."""
