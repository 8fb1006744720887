"""The offline gate tools over logged rollouts: the sweep (``evaluate``), the held-out evaluation
(``heldout``), the replay of logs through a gate as a run would meet them (``replay``) and the
learned gate's fitting CLI (``fit``). They import the run-time gate library, never the reverse."""
