#!/bin/sh
# Install the headless browser tests/test_report_page.py opens the analyst page in (Debian package
# `chromium`). Idempotent: does nothing when a chromium binary is already on PATH. Needs root (or sudo).
set -eu

for bin in chromium chromium-browser; do
    if command -v "$bin" >/dev/null 2>&1; then
        echo "chromium already installed: $(command -v "$bin")"
        exit 0
    fi
done

if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
$SUDO apt-get update
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends chromium fonts-dejavu-core
command -v chromium
