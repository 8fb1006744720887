"""The bench scripts' ``--tiny`` flag, in one place.

``--tiny`` runs a script at the smallest sizes that still take every code path it has, in seconds
to a few minutes, so that CI can run the command a record or the README names and notice when it
stops working (tests/bench/test_tiny_modes.py). Its figures mean nothing. A script that takes
run-config overrides plays ``TINY_RUN`` (tiny games, one group of G = 2, no warm start) under its
own overrides.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from selective_rollout.analysis.experiment import TINY_RUN


def parse_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None = None, **tiny: Any
) -> argparse.Namespace:
    """``parser``'s arguments plus ``--tiny``, which makes ``tiny`` the defaults (an option given
    on the command line still wins) and puts ``TINY_RUN`` before a script's own ``overrides``."""
    parser.add_argument(
        "--tiny", action="store_true", help="the smallest sizes that run every code path (what CI runs)"
    )
    if parser.parse_known_args(argv)[0].tiny:
        parser.set_defaults(**tiny)
    args = parser.parse_args(argv)
    if args.tiny and "overrides" in vars(args):
        args.overrides = [*TINY_RUN, *args.overrides]
    return args
