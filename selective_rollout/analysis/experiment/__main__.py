"""``python -m selective_rollout.analysis.experiment``: the experiment runner's command line (``cli``)."""

from selective_rollout.analysis.experiment.cli import main

raise SystemExit(main())
