"""Play one game: ``python -m alfworld_env.play GAME_DIR [--commands "a;b" --json]``.

Interactive by default (type commands, ``quit`` to stop); with ``--commands`` it plays them in
order and, with ``--json``, prints one JSON object per step for scripts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from alfworld_env import speedups
from alfworld_env.engine import Episode, Observation
from alfworld_env.errors import GameError


def _emit(command: str | None, ob: Observation, as_json: bool) -> None:
    if as_json:
        row = {"command": command, "obs": ob.obs, "admissible": ob.admissible, "done": ob.won, "won": ob.won}
        print(json.dumps(row), flush=True)
    else:
        print(f"\n{ob.obs}\n[admissible: {', '.join(ob.admissible)}]", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("game_dir", help="folder holding game.tw-pddl")
    ap.add_argument("--commands", help="';'-separated commands to play instead of reading stdin")
    ap.add_argument("--json", action="store_true", help="one JSON object per step")
    args = ap.parse_args(argv)
    game_file = Path(args.game_dir) / "game.tw-pddl"
    if not game_file.is_file():
        print(f"error: no game.tw-pddl in {args.game_dir}", file=sys.stderr)
        return 2
    speedups.enable()
    try:
        ep = Episode(str(game_file))
        ob = ep.reset()
    except GameError as exc:
        print(f"error: {game_file}: {exc}", file=sys.stderr)
        return 2
    _emit(None, ob, args.json)
    if args.commands is not None:
        commands = iter(c.strip() for c in args.commands.split(";") if c.strip())
    else:
        commands = iter(lambda: input("> ").strip(), "quit")
    try:
        for command in commands:
            ob = ep.step(command)
            _emit(command, ob, args.json)
            if ob.won:
                break
    except EOFError:
        pass
    except GameError as exc:
        print(f"error: {game_file}: {exc}", file=sys.stderr)
        return 2
    finally:
        ep.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
