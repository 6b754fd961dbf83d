#!/usr/bin/env bash
# The GPU paths of pt-train in one command of at most 8 minutes (its budget), on one GPU
# without a network: bf16 SFT of Qwen2.5-0.5B- and 1.5B-shaped models with DeepSpeed
# ZeRO-2 and stage 0 (tokens/s, MFU, peak memory), DFT, DPO, one round of OPD and of GRPO
# with the HF engine, per-sample vs engine-seeded sampling, the plain engine; see
# bench/gpu_check.py.
#
#   bash bench/gpu_wheels.sh                 # here, once: the wheels in .whl/
#   bash bench/gpu_check.sh                  # there, with .whl/ carried along
#   bash bench/gpu_check.sh --dry-run        # the same sequence on a CPU (PT_GPU_CHECK_DRY=1)
#   bash bench/gpu_check.sh --only=grpo-0.5b --budget-s=300   # some checks; plan the rest
#
# On a GPU it installs .whl/*.whl into /tmp/site (no index, no dependencies: the machine's
# python3 has torch, transformers and the rest), refusing wheels built from other sources
# than this tree. A dry run uses this checkout's .venv (or $PYTHON) as it is. The figures
# go to $OUT/gpu_check.json (./gpu-check-out/ when OUT is unset), the end of every check's
# log to gpu_check.log beside it.
set -euo pipefail

PT_GPU_CHECK_STARTED=$(date +%s)
export PT_GPU_CHECK_STARTED
REPO=$(cd "$(dirname "$0")/.." && pwd)
DRY=${PT_GPU_CHECK_DRY:-0}
PASS=()  # passed on to gpu_check.py
for arg in "$@"; do
    case $arg in
        --dry-run) DRY=1 ;;
        --only=* | --budget-s=*) PASS+=("$arg") ;;
        -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *)
            echo "gpu_check.sh: unknown argument '$arg' (use --dry-run, --only=NAME,NAME," \
                "--budget-s=SECONDS or --help)" >&2
            exit 2
            ;;
    esac
done
OUT_DIR=${OUT:-$PWD/gpu-check-out}
cd "$REPO"

if [ "$DRY" = 1 ]; then
    PY=${PYTHON:-}
    if [ -z "$PY" ]; then
        if [ -x "$REPO/.venv/bin/python" ]; then PY=$REPO/.venv/bin/python; else PY=python3; fi
    fi
    export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu}
    exec "$PY" bench/gpu_check.py --dry-run --out "$OUT_DIR" ${PASS[@]+"${PASS[@]}"}
fi

PY=${PYTHON:-python3}
if ! compgen -G ".whl/*.whl" > /dev/null; then
    echo "gpu_check.sh: no wheels in $REPO/.whl: run 'bash bench/gpu_wheels.sh' where there is" \
        "a network, and carry .whl to this machine (or use --dry-run on a CPU)" >&2
    exit 2
fi
built_from=$(cat .whl/pt-source.sha256 2> /dev/null || echo none)
if [ "$built_from" != "$("$PY" bench/gpu_check.py --source-hash)" ]; then
    echo "gpu_check.sh: the wheels in .whl were built from other pt sources than this tree's:" \
        "run 'bash bench/gpu_wheels.sh' again" >&2
    exit 2
fi
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PATH=/tmp/site/bin:$PATH
echo "wheels installed in $(($(date +%s) - PT_GPU_CHECK_STARTED)) s" >&2
exec "$PY" bench/gpu_check.py --out "$OUT_DIR" ${PASS[@]+"${PASS[@]}"}
