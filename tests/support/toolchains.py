"""Cross toolchains and emulators a test needs: skipped locally when missing,
a failure under CI=true (.ci/run installs them, so a missing one there is a bug)."""

from __future__ import annotations

import os
import shutil

import pytest

# The Debian package providing each command the cross tests run.
PACKAGES = {
    "aarch64-linux-gnu-gcc": "gcc-aarch64-linux-gnu",
    "riscv64-linux-gnu-gcc": "gcc-riscv64-linux-gnu",
    "qemu-aarch64": "qemu-user",
    "qemu-riscv64": "qemu-user",
    "clang": "clang",
    "readelf": "binutils",
    "nginx": "nginx",
    "chromium": "chromium",
    "arm-none-eabi-gcc": "gcc-arm-none-eabi",
    "qemu-system-arm": "qemu-system-arm",
}
# picolibc for arm-none-eabi (no command of its own): its gcc specs file.
PICOLIBC_SPECS = "/usr/lib/picolibc/arm-none-eabi/picolibc.specs"


def require_tools(*commands: str) -> None:
    """Skip the calling test unless every command is on PATH; under CI=true fail."""
    missing = [c for c in commands if shutil.which(c) is None]
    if not missing:
        return
    names = ", ".join(f"{c} (Debian package {PACKAGES.get(c, '?')})" for c in missing)
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but missing: {names}")
    pytest.skip(f"missing: {names}")


def require_board() -> None:
    """Skip unless the Cortex-M toolchain, picolibc and qemu-system-arm are installed
    (gcc-arm-none-eabi, picolibc-arm-none-eabi, qemu-system-arm); under CI=true fail."""
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    if not os.path.exists(PICOLIBC_SPECS):
        message = f"missing: {PICOLIBC_SPECS} (Debian package picolibc-arm-none-eabi)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {message}")
        pytest.skip(message)
