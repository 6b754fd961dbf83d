"""`pt-eval`: Extract and grade math answers; pass@k and benchmark runs.

This module only parses arguments and calls library functions.
"""

from __future__ import annotations

from pt_core.cli import make_app, make_main
from pt_eval import __version__

app = make_app("pt-eval", "Extract and grade math answers; pass@k and benchmark runs.", __version__)

main = make_main(app)

if __name__ == "__main__":
    main()
