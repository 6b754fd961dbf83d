"""`pt-train`: Train causal language models with DeepSpeed (SFT, DFT, DPO, OPD).

This module only parses arguments and calls library functions.
"""

from __future__ import annotations

from pt_core.cli import make_app, make_main
from pt_train import __version__

app = make_app(
    "pt-train", "Train causal language models with DeepSpeed (SFT, DFT, DPO, OPD).", __version__
)

main = make_main(app)

if __name__ == "__main__":
    main()
