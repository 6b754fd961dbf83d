#!/usr/bin/env bash
# The wheels that bench/gpu_check.sh installs on a GPU machine without a network.
#
#   bash bench/gpu_wheels.sh            # -> .whl/ (ignored by git); prints the list and size
#
# That machine's python3 (CPython 3.12, x86_64) already holds torch, transformers,
# accelerate, peft, pyarrow, rich, typer, safetensors, tokenizers, numpy, pyyaml, jinja2,
# sympy, psutil, msgpack, ninja, einops, py-cpuinfo, tqdm and packaging. What pt needs
# beyond them, at the versions of uv.lock:
#
#   - pt's own packages (pt-core, pt-data, pt-rollout, pt-eval, pt-train), built from this
#     tree; a hash of their sources goes beside them, so that gpu_check.sh refuses wheels
#     older than the tree it runs in;
#   - pydantic with pydantic-core (binary: cp312 manylinux x86_64), annotated-types,
#     typing-inspection and typing-extensions (pydantic needs a recent one);
#   - deepspeed, which PyPI has as a source archive only: built here into a pure-Python
#     wheel with no pre-compiled ops (DS_BUILD_OPS=0; ZeRO-2 with torch's AdamW needs none
#     on a GPU, and any other op compiles on first use with the machine's nvcc and ninja),
#     and hjson, which it imports.
#
# Not carried: datasets and polars (pt-data imports datasets only to read hub datasets and
# save_to_disk directories, which gpu_check.sh does not use), vLLM and flash-attn (too
# large; flash-attn is a CUDA build of its own).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
WHL=${PT_WHEEL_DIR:-$REPO/.whl}
PY=${PYTHON:-python3}
PACKAGES=(pt-core pt-data pt-rollout pt-eval pt-train)
PINNED=(pydantic pydantic-core annotated-types typing-inspection typing-extensions hjson)

"$PY" -m pip --version > /dev/null 2>&1 || {
    echo "gpu_wheels.sh: $PY has no pip (set PYTHON to an interpreter with pip)" >&2
    exit 2
}

# NAME==VERSION of each name, as uv.lock pins it.
locked() {
    "$PY" - "$REPO/uv.lock" "$@" <<'EOF'
import sys, tomllib

lock = tomllib.load(open(sys.argv[1], "rb"))
versions = {p["name"]: p["version"] for p in lock["package"] if "version" in p}
for name in sys.argv[2:]:
    if name not in versions:
        sys.exit(f"gpu_wheels.sh: uv.lock pins no {name}")
    print(f"{name}=={versions[name]}")
EOF
}

rm -rf "$WHL"
mkdir -p "$WHL"

echo "pt's packages (built from this tree)" >&2
for package in "${PACKAGES[@]}"; do
    "$PY" -m pip wheel --quiet --no-deps --wheel-dir "$WHL" "$REPO/packages/$package"
done
"$PY" "$REPO/bench/gpu_check.py" --source-hash > "$WHL/pt-source.sha256"

echo "pydantic and what it needs, hjson (CPython 3.12, manylinux x86_64)" >&2
mapfile -t pins < <(locked "${PINNED[@]}" deepspeed)
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --dest "$WHL" \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 --platform any \
    "${pins[@]:0:${#PINNED[@]}}"

echo "deepspeed (a source archive on PyPI: built into a pure-Python wheel)" >&2
DS_BUILD_OPS=0 "$PY" -m pip wheel --quiet --no-deps --no-binary deepspeed --wheel-dir "$WHL" \
    "${pins[-1]}"

# One wheel per distribution: two versions of one stop the install there.
"$PY" - "$WHL" <<'EOF'
import collections, pathlib, sys

names = collections.Counter(p.name.split("-")[0].lower() for p in pathlib.Path(sys.argv[1]).glob("*.whl"))
if twice := [n for n, c in names.items() if c > 1]:
    sys.exit(f"gpu_wheels.sh: more than one wheel of {', '.join(twice)} in {sys.argv[1]}")
EOF

find "$WHL" -maxdepth 1 -type f -printf '%s %f\n' | sort -k2 \
    | awk '{printf "  %8.1f KiB  %s\n", $1 / 1024, $2}' >&2
total=$(du -sb "$WHL" | cut -f1)
awk -v b="$total" -v d="$WHL" 'BEGIN {printf "total %.1f MiB in %s (at most 64 MiB travel with the working tree)\n", b / 1048576, d}' >&2
