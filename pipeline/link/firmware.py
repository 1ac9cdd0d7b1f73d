"""The program that runs an AOT model on files (pipeline/runtime/c/aot_main.c):
on a bare-metal target, the test firmware given to the board's emulator; on a host,
an ordinary program linking lib<m>.a, as a user's C program would.

A bare-metal firmware is linked with picolibc (Debian's picolibc-arm-none-eabi and
picolibc-riscv64-unknown-elf: `--specs=picolibc.specs --oslib=semihost`, its startup
code and vector table, stdio on the host's files through semihosting) and placed in
the board's memory map through picolibc.ld's `__flash`, `__ram` symbols; its stack
is the kernels' largest stack use plus STACK_MARGIN.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.files import temp_output
from pipeline.ir.target import Target
from pipeline.link.cc import _run, _tool, machine_flags

__all__ = ["AOT_MAIN_C", "BOARDS", "STACK_MARGIN", "board_of", "link_aot_program"]

AOT_MAIN_C = Path(__file__).resolve().parent.parent / "runtime" / "c" / "aot_main.c"
# Boards qemu-system-arm and qemu-system-riscv32 emulate, by the cpu (Arm) or the
# architecture (RISC-V) they carry: flash and RAM (origin, bytes), and the processor
# clock SysTick counts in Hz (measured: under -icount shift=0 a loop of 300,000
# instructions took 7500 ticks on an386 and an500, 6000 on an505, 9600 on an547).
BOARDS = {
    "mps2-an386": {"cpu": "cortex-m4", "flash": (0x0, 4 << 20), "ram": (0x20000000, 4 << 20),
                   "hz": 25_000_000},
    "mps2-an500": {"cpu": "cortex-m7", "flash": (0x0, 4 << 20), "ram": (0x20000000, 4 << 20),
                   "hz": 25_000_000},
    # The secure aliases (the core starts in the secure state): SSRAM1, SSRAM2/3.
    "mps2-an505": {"cpu": "cortex-m33", "flash": (0x10000000, 4 << 20),
                   "ram": (0x38000000, 4 << 20), "hz": 20_000_000},
    # ITCM (512 KiB) for the code, the secure alias of SRAM (2 MiB) for the data.
    "mps3-an547": {"cpu": "cortex-m55", "flash": (0x10000000, 512 << 10),
                   "ram": (0x31000000, 2 << 20), "hz": 32_000_000},
    # RAM from 0x80000000 (128 MiB by default), where `-bios none` starts the firmware:
    # its first 4 MiB stand for flash, the next 4 MiB for RAM.
    "virt": {"arch": "riscv32", "flash": (0x80000000, 4 << 20), "ram": (0x80400000, 4 << 20)},
}
# Stack beyond the kernels' own: the harness, picolibc's stdio and semihosting.
STACK_MARGIN = 4096


def board_of(target: Target) -> str:
    """The board a bare-metal target's firmware is linked for: the first of BOARDS
    carrying its cpu (Arm) or its architecture (RISC-V). ValueError naming the
    boards there are for other cpus."""
    for name, board in BOARDS.items():
        if board.get("cpu") == target.cpu or board.get("arch") == target.arch:
            return name
    raise ValueError(f"no board for cpu {target.cpu!r} of {target.triple}; boards: "
                     + ", ".join(f"{n} ({b.get('cpu') or b['arch']})"
                                 for n, b in BOARDS.items()))


def _firmware_flags(target: Target, stack_bytes: int) -> list[str]:
    board = BOARDS[board_of(target)]
    (flash, flash_size), (ram, ram_size) = board["flash"], board["ram"]
    symbols = {"__flash": flash, "__flash_size": flash_size, "__ram": ram,
               "__ram_size": ram_size, "__stack_size": -(-stack_bytes // 8) * 8}
    return ["--specs=picolibc.specs", "--oslib=semihost", "-DPL_SEMIHOST_EXIT",
            *(f"-Wl,--defsym={k}={v:#x}" for k, v in symbols.items()), "-Wl,--gc-sections"]


def link_aot_program(output: str | os.PathLike, archive: str | os.PathLike,
                     header: str | os.PathLike, metadata: dict, target: Target,
                     cc: str | None = None, defines: tuple[str, ...] = ()) -> None:
    """Compile aot_main.c for the model of `metadata` (build_aot's metadata.json)
    and link it with `archive` (lib<m>.a) into the program `output`, by cc (None:
    the host's). A bare-metal target gets the firmware (module doc); a host the
    program linked with libm and libgomp (the kernels' thread team). `defines`:
    more -D options for aot_main.c (PL_COUNT_TICKS). LinkError if the compiler fails."""
    (name, module), = metadata["modules"].items()
    stack = max((f["workspace"][0]["workspace_size_bytes"]
                 for f in module["memory"]["functions"]["operator_functions"]), default=0)
    io_size = module["memory"]["functions"]["main"][0]["io_size_bytes"]
    defines = [f"-DPL_MODEL={name}", f"-DPL_NUM_INPUTS={len(module['inputs'])}",
               f"-DPL_NUM_OUTPUTS={len(module['outputs'])}", f"-DPL_IO_SIZE={io_size}",
               *(f"-D{d}" for d in defines)]
    machine = machine_flags(target.triple, target.cpu, target.features)
    # picolibc's specs once: gcc refuses a second copy (riscv32's machine flags have it).
    flags = ([f for f in _firmware_flags(target, stack + STACK_MARGIN) if f not in machine]
             if target.bare_metal else ["-lgomp"])
    with temp_output(output) as tmp:
        _run("link AOT program", [
            *_tool(cc), *machine, "-std=c11", "-O2",
            "-include", os.fspath(header), *defines, "-o", tmp, str(AOT_MAIN_C),
            os.fspath(archive), "-lm", *flags])
        os.chmod(tmp, 0o755)
