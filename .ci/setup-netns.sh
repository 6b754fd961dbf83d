#!/usr/bin/env bash
# A second host for the tests of generators on other nodes: iproute2's `ip netns`, which
# the tests use to make a network namespace with its own loopback and a veth link to this
# one (packages/pt-train/tests/listening.py). Idempotent: installs only what is missing.
set -euo pipefail

if ! command -v ip >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup-netns: need root to install iproute2" >&2
        exit 1
    fi
    echo "setup-netns: installing iproute2" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq iproute2 >/dev/null
fi
name="pt-setup-check-$$"
ip netns add "$name"
ip netns del "$name"
echo "setup-netns: ok ($(ip -V))" >&2
