"""`pt-slurm`: Render, submit and watch self-requeueing SLURM jobs.

This module only parses arguments and calls library functions.
"""

from __future__ import annotations

from pt_core.cli import make_app, make_main
from pt_slurm import __version__

app = make_app("pt-slurm", "Render, submit and watch self-requeueing SLURM jobs.", __version__)

main = make_main(app)

if __name__ == "__main__":
    main()
