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
    "riscv64-unknown-elf-gcc": "gcc-riscv64-unknown-elf",
    "qemu-system-riscv32": "qemu-system-misc",
}
# picolibc for arm-none-eabi and riscv64-unknown-elf (no command of its own): its gcc
# specs file.
PICOLIBC_SPECS = "/usr/lib/picolibc/arm-none-eabi/picolibc.specs"
PICOLIBC_RISCV_SPECS = "/usr/lib/picolibc/riscv64-unknown-elf/picolibc.specs"


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
    _require_file(PICOLIBC_SPECS, "picolibc-arm-none-eabi")


def require_riscv32_board() -> None:
    """Skip unless the bare-metal RISC-V toolchain, its picolibc and qemu-system-riscv32
    are installed (gcc-riscv64-unknown-elf, picolibc-riscv64-unknown-elf,
    qemu-system-misc); under CI=true fail."""
    require_tools("riscv64-unknown-elf-gcc", "qemu-system-riscv32")
    _require_file(PICOLIBC_RISCV_SPECS, "picolibc-riscv64-unknown-elf")


def _require_file(path: str, package: str) -> None:
    if not os.path.exists(path):
        message = f"missing: {path} (Debian package {package})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {message}")
        pytest.skip(message)
