"""Time the test decoder (tests/support/decoder_models.py) against onnxruntime:

    PYTHONPATH=$PWD python -m tests.support.bench_decoder --out /tmp/bench-decoder

builds the float32 and the 4-bit decoder (its MatMuls and token embeddings 4-bit;
MODELS: at accuracy level 0 and 4) into VM libraries (batch 1, seq 1..128, past
0..256), then for each model, thread count and call, a decode step (1 token after a
past of 128) and a prefill (128 tokens, an empty past), runs `rounds` rounds
alternating the sides, each side in a fresh process (pipeline.tools.bench_runner, as
`doit bench` does), and prints per line the medians of the rounds' medians, ours /
onnxruntime, and the decode step's weight bytes per second against the machine's
streaming read bandwidth (pipeline.tools.peak), and the same for the decode step in
`pipeline-run` (the C runtime, no Python: rounds x runs calls in one process, the
median). Last, the peak resident memory of `pipeline-run` running a decode step of
each library, and its ratio to the float32 one's. No assertion on speed: the figures
mean something only on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx

from tests.support.decoder_models import VOCAB, decoder, initial_cache, step_feeds

DIMS = ["batch=1:1", "seq=1:128", "past=0:256"]
CALLS = {"decode": (1, 128), "prefill": (128, 0)}  # (seq, past)
_ROOT = str(Path(__file__).resolve().parents[2])


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the initializers MatMul and MatMulNBits nodes read (the weights a
    decode step streams)."""
    inits = {t.name: t for t in model.graph.initializer}
    used = {i for n in model.graph.node if n.op_type in ("MatMul", "MatMulNBits")
            for i in n.input if i in inits}
    return sum(onnx.numpy_helper.to_array(inits[i]).nbytes for i in used)


def _side(side: str, path: Path, feeds: Path, threads: int, runs: int) -> float:
    """One round of one side in a fresh process: the median of its runs, ms."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH"))
                                          if p))
    proc = subprocess.run([sys.executable, "-m", "pipeline.tools.bench_runner", side,
                           str(path), str(feeds), f"--threads={threads}", f"--runs={runs}",
                           "--warmup=5"], capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench_decoder: {side} {path}: {proc.stderr.strip()}")
    return statistics.median(json.loads(proc.stdout.strip().splitlines()[-1])["times_ms"])


# name -> (bits, accuracy_level): float32; 4-bit with float activations (onnxruntime's
# quantizer's default level); 4-bit at level 4, int8 activations (what onnxruntime-
# genai's CPU int4 models ask for, and its own CPU benchmarks build).
MODELS = {"gpt0": (0, 0), "gpt4": (4, 0), "gpt4a4": (4, 4)}


def _build(out: Path, name: str) -> tuple[Path, Path, int]:
    from pipeline.tools.cli import compile_model

    bits, level = MODELS[name]
    model = decoder(bits, quantized_embeddings=bits == 4, accuracy_level=level)
    path = out / f"{name}.onnx"
    onnx.save(model, path)
    so = out / f"{name}.so"
    compile_model(str(path), str(so), "llvm -mcpu=native", executor="vm",
                  cache=str(out / "cache"), dims=DIMS)
    return path, so, weight_bytes(model)


def _pipeline_run(pipeline_run: Path, so: Path, feeds: Path, out: Path, *flags: str) -> str:
    """The stdout of `pipeline_run` running library `so` on the arrays of the .npz
    `feeds` (written out as .npy under `out`) with `flags`."""
    args = [str(pipeline_run), str(so.resolve()), "--output-dir", str(out / "outputs"),
            *flags]
    with np.load(feeds) as arrays:
        for name in arrays.files:
            np.save(out / f"{name}.npy", arrays[name])
            args += ["--input", f"{name}={out / name}.npy"]
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench_decoder: {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def peak_rss_mb(pipeline_run: Path, so: Path, feeds: Path, out: Path) -> float:
    """Peak resident memory (MB) `pipeline_run --print-memory` reports for one run of
    library `so` on the arrays of the .npz `feeds`."""
    text = _pipeline_run(pipeline_run, so, feeds, out, "--print-memory")
    return float(text.split()[2])  # "memory: peak X MB resident"


def step_ms(pipeline_run: Path, so: Path, feeds: Path, out: Path, threads: int,
            runs: int) -> float:
    """The median time (ms) of `runs` calls of library `so` on `feeds` in
    `pipeline_run` at `threads` threads: the C runtime alone, no Python around it."""
    text = _pipeline_run(pipeline_run, so, feeds, out, "--threads", str(threads),
                         "--repeat", str(runs), "--print-time")
    return float(text.split("median")[1].split()[0])  # "time: median X ms, min ..."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a folder for the files")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    from pipeline.tools.peak import measure_read_gbps

    rng = np.random.default_rng(0)
    for name, (seq, past) in CALLS.items():
        ids = rng.integers(0, VOCAB, (1, seq)).astype(np.int64)
        np.savez(args.out / f"{name}.npz", **step_feeds(ids, past, initial_cache(1, past)))
    from pipeline.link.runtime_c import build_pipeline_run

    run = args.out / "pipeline-run"
    build_pipeline_run(run)
    (args.out / "rss").mkdir(exist_ok=True)
    libraries = {}
    for name in args.models.split(","):
        model, so, weights = _build(args.out, name)
        libraries[name] = so
        print(f"{name}: library {so.stat().st_size} bytes, MatMul weights {weights} "
              "bytes", flush=True)
        for threads in (int(t) for t in args.threads.split(",")):
            gbps = measure_read_gbps(threads)
            for call in CALLS:
                feeds = args.out / f"{call}.npz"
                ours, theirs = [], []
                for _ in range(args.rounds):  # alternating: ours, onnxruntime, ours...
                    ours.append(_side("ours", so, feeds, threads, args.runs))
                    theirs.append(_side("onnxruntime", model, feeds, threads, args.runs))
                mine, peer = statistics.median(ours), statistics.median(theirs)
                line = (f"{name} {call:7s} threads {threads}: ours {mine:.3f} ms, "
                        f"onnxruntime {peer:.3f} ms, ratio {mine / peer:.2f}")
                if call == "decode":
                    achieved = weights / mine / 1e6
                    alone = step_ms(run, so, feeds, args.out / "rss", threads,
                                    args.rounds * args.runs)
                    line += (f"; weights at {achieved:.2f} GB/s, {100 * achieved / gbps:.0f}%"
                             f" of the streaming read bandwidth ({gbps:.1f} GB/s); "
                             f"pipeline-run (no Python) {alone:.3f} ms, "
                             f"{100 * weights / alone / 1e6 / gbps:.0f}%")
                print(line, flush=True)
    rss = {name: peak_rss_mb(run, so, args.out / "decode.npz", args.out / "rss")
           for name, so in libraries.items()}
    print("pipeline-run decode step peak RSS: " + ", ".join(
        f"{name} {mb:.1f} MB" + (f" ({mb / rss['gpt0']:.3f} of gpt0)" if "gpt0" in rss and
                                 name != "gpt0" else "") for name, mb in rss.items()),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
