"""`pt-rollout`: Generate rollouts and score them with a teacher (vLLM or HF).

This module only parses arguments and calls library functions.
"""

from __future__ import annotations

from pt_core.cli import make_app, make_main
from pt_rollout import __version__

app = make_app(
    "pt-rollout", "Generate rollouts and score them with a teacher (vLLM or HF).", __version__
)

main = make_main(app)

if __name__ == "__main__":
    main()
