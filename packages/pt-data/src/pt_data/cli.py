"""`pt-data`: Load, transform, mix, template, tokenize, pack and inspect datasets.

This module only parses arguments and calls library functions.
"""

from __future__ import annotations

from pt_core.cli import make_app, make_main
from pt_data import __version__

app = make_app(
    "pt-data", "Load, transform, mix, template, tokenize, pack and inspect datasets.", __version__
)

main = make_main(app)

if __name__ == "__main__":
    main()
