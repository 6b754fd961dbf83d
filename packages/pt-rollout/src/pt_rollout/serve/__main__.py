"""``python -m pt_rollout.serve``: ``pt-rollout serve`` in the interpreter that runs it (a
trainer starts its generator processes this way, in the environment ``rollout.python``
names)."""

import sys

from pt_rollout.cli import main

if __name__ == "__main__":
    sys.argv[1:1] = ["serve"]
    main()
