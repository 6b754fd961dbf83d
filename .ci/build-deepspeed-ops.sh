#!/usr/bin/env bash
# DeepSpeed's CPU accelerator compiles a C++ op (shared-memory collectives) the first time
# a process initialises DeepSpeed: 50 to 120 s on 2 cores, once per environment, cached
# under ~/.cache/torch_extensions/py311_<torch build>/. Build it here, for the workspace
# venv and the vLLM side environment, so that no test waits for the compiler. The cache
# holds one build per torch build: a second checkout of the repo on the same machine
# rebuilds it (its include paths differ) each time it runs after the other. So does
# another ninja: torch runs the first `ninja` on PATH, ninja's build log keys each command
# by a hash that ninja 1.13 computes differently from 1.11, and a build by the other
# version is built again (25 to 45 s). The tests run under `uv run`, whose PATH starts
# with the environment's bin/ (ninja 1.13 from PyPI), not the system's (Debian's 1.11):
# build with that PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

export DS_ACCELERATOR=cpu
for venv in .venv .venv-vllm; do
    [ -x "$venv/bin/python" ] || continue
    start=$(date +%s)
    PATH="$PWD/$venv/bin:$PATH" "$venv/bin/python" - <<'PY'
from deepspeed.accelerator import get_accelerator

builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
if builder is not None:
    builder.load(verbose=False)
PY
    echo "[build-deepspeed-ops] $venv: $(($(date +%s) - start)) s" >&2
done
