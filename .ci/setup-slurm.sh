#!/usr/bin/env bash
# SLURM for the pt-slurm tests: Debian's slurm-wlm (slurmctld, slurmd and the clients),
# munge, and shellcheck for the rendered job scripts. Idempotent: installs only what is
# missing. The tests themselves start and stop the daemons (packages/pt-slurm/tests/conftest.py).
set -euo pipefail

need=()
command -v slurmctld >/dev/null 2>&1 || need+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || need+=(munge)
command -v shellcheck >/dev/null 2>&1 || need+=(shellcheck)
if [ "${#need[@]}" -eq 0 ]; then
    echo "setup-slurm: slurm-wlm, munge and shellcheck already installed" >&2
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    else
        echo "setup-slurm: need root (or sudo) to install: ${need[*]}" >&2
        exit 1
    fi
else
    SUDO=()
fi

echo "setup-slurm: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq "${need[@]}" >/dev/null

for cmd in slurmctld slurmd sbatch srun scontrol munged shellcheck; do
    command -v "$cmd" >/dev/null 2>&1 || { echo "setup-slurm: $cmd missing after install" >&2; exit 1; }
done
echo "setup-slurm: ok ($(slurmctld -V))" >&2
