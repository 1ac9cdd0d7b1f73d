"""Executed instructions of an AOT model's run on its emulated Cortex-M board, and
the code size of its kernels: what an int8 kernel change did, since qemu counts no
cycles and its timings say nothing about the core's.

    python -m pipeline.tools.board_count out/kws_q/m4 [out/kws_q/m55 ...] [--cc CC]

For each built folder out/<m>/<t> (doit build of an aot entry on a bare-metal
target, validated once so validation/in_<name>.npy holds its inputs) it links the
test firmware again with PL_COUNT_TICKS (pipeline/runtime/c/aot_main.c reads
SysTick around the model's run), runs it on the board under `qemu-system-arm
-icount shift=0`, where the virtual clock advances 1 ns per executed instruction,
and converts the ticks with the board's clock (pipeline/link/firmware.py BOARDS;
one tick is 40 instructions on the 25 MHz boards, so that is the resolution). It
prints one line per folder: model, target, board, instructions, and the .text
bytes of lib0.o (the kernels) and of the whole firmware.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from pipeline.ir.target import parse_target
from pipeline.link.elf import section_sizes
from pipeline.link.firmware import BOARDS, board_of, link_aot_program


def count(folder: Path, cc: str = "arm-none-eabi-gcc") -> dict:
    """{"model", "target", "board", "instructions", "kernels_text", "firmware_text"} of
    the AOT build in `folder` (module doc). RuntimeError if the firmware fails."""
    metadata = json.loads((folder / "metadata.json").read_text())
    (name, module), = metadata["modules"].items()
    target = parse_target(module["target"][0])
    board = board_of(target)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        for i, field in enumerate(module["inputs"]):
            value = np.load(folder / "validation" / f"in_{field}.npy")
            (run / f"input_{i}.bin").write_bytes(np.ascontiguousarray(value).tobytes())
        firmware = run / "count.elf"
        link_aot_program(firmware, folder / f"lib{name}.a", folder / f"{name}.h", metadata,
                         target, cc, defines=("PL_COUNT_TICKS",))
        proc = subprocess.run(
            ["qemu-system-arm", "-M", board, "-nographic", "-semihosting-config",
             "enable=on,target=native", "-icount", "shift=0", "-kernel", str(firmware)],
            cwd=run, capture_output=True, text=True, timeout=900)
        found = re.search(r"ticks: (\d+)", proc.stdout + proc.stderr)  # semihosting: stderr
        if proc.returncode or not found:
            raise RuntimeError(f"{folder}: the firmware failed ({proc.returncode}): "
                               f"{proc.stdout.strip()} {proc.stderr.strip()}")
        firmware_text = section_sizes(firmware.read_bytes())["text"]
    return {"model": name, "target": folder.name, "board": board,
            "instructions": int(found.group(1)) * 1_000_000_000 // BOARDS[board]["hz"],
            "kernels_text": section_sizes((folder / "lib0.o").read_bytes())["text"],
            "firmware_text": firmware_text}


def main(argv: list[str] | None = None) -> None:
    """The command line: one line per folder (module doc)."""
    parser = argparse.ArgumentParser(prog="python -m pipeline.tools.board_count")
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--cc", default="arm-none-eabi-gcc")
    args = parser.parse_args(argv)
    for folder in args.folders:
        c = count(folder, args.cc)
        print(f"{c['model']} {c['target']} ({c['board']}): {c['instructions']:,} "
              f"instructions, kernels .text {c['kernels_text']:,} B, "
              f"firmware .text {c['firmware_text']:,} B")


if __name__ == "__main__":
    main()
