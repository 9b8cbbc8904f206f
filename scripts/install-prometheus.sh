#!/bin/sh
# Install the Prometheus server used by tests/test_metrics.py (Debian/Ubuntu package `prometheus`).
# Idempotent: does nothing when a `prometheus` binary is already on PATH. Needs root (or sudo).
set -eu

if command -v prometheus >/dev/null 2>&1; then
    echo "prometheus already installed: $(command -v prometheus)"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
# The package's post-install starts a system service where an init system runs; the tests start
# their own server on a free loopback port and never use that one.
$SUDO apt-get update
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends prometheus
command -v prometheus
