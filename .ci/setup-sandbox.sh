#!/usr/bin/env bash
# The sandbox for model-written code (pt_rollout.sandbox): bubblewrap, and a check that it
# can make its namespaces here. The unshare fallback needs only util-linux, which Debian
# always has. Idempotent: installs only what is missing.
set -euo pipefail

if ! command -v bwrap >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup-sandbox: need root to install bubblewrap" >&2
        exit 1
    fi
    echo "setup-sandbox: installing bubblewrap" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq bubblewrap >/dev/null
fi
bwrap --unshare-all --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib \
    --symlink usr/lib64 /lib64 -- true
echo "setup-sandbox: ok ($(bwrap --version))" >&2
