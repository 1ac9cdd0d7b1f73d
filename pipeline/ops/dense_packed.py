"""dense_packed: y = a @ W.T (+ bias) with W packed at build time as [ceil(N/b), K, b].

b is the target's vector width: row k of a packed block holds the weights of b
consecutive outputs, so the kernel keeps G output vectors in registers and adds
a[m, k] * W[block, k, :] to each (G independent FMA chains hide the latency). The
weight is zero-padded to whole blocks; the outputs of a last partial block are
computed as one vector and stored lane by lane through the scalar epilogue.
Work items (row m, group of G blocks) are split over threads.
"""

from __future__ import annotations

import numpy as np

from pipeline.dsl.vector import (
    apply_epilogue,
    fma,
    parallel_for,
    prefetch,
    zeros,
)
from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.conv_blocked import PREFETCH_BYTES
from pipeline.ops.registry import register


def _infer(types, node):
    a, w = types[0], types[1]
    nb, k, b = w.shape
    n = node.attr("units")
    if a.shape[-1] != k or not (nb - 1) * b < n <= nb * b:
        raise ModelError(f"node {node.name!r} (dense_packed): input {list(a.shape)} does "
                         f"not match packed weight {list(w.shape)} for {n} units")
    return [TensorType(a.shape[:-1] + (n,), a.dtype)]


def pack_dense_weight(weight: np.ndarray, block: int) -> np.ndarray:
    """[N, K] -> [ceil(N/block), K, block], zero-padded."""
    n, k = weight.shape
    nb = -(-n // block)
    padded = np.zeros((nb * block, k), weight.dtype)
    padded[:n] = weight
    return padded.reshape(nb, block, k).transpose(0, 2, 1).copy()


def _lower(kb, node, ins, out, epilogue):
    a, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    nb_n, k_n, vb = w.type.shape
    n_n = out.type.shape[-1]
    m_n = a.type.size // k_n
    full = n_n // vb
    # G blocks per work item: independent FMA chains, but enough items to share out
    group = next((g for g in (4, 2) if full % g == 0 and full // g >= 8), 1)

    def block(m, nb0, count, with_bias):
        """Vectors of `count` consecutive blocks from nb0 for row m."""
        accs = [kb.local(kb.vload(bias, (nb0 + g) * vb, vb) if with_bias
                         else zeros(vb)) for g in range(count)]
        with kb.loop(0, k_n, "k") as k:
            av = kb.splat(kb.load(a, m * k_n + k), vb)
            for g, acc in enumerate(accs):
                at = (nb0 + g) * (k_n * vb) + k * vb
                prefetch(kb, w, at + PREFETCH_BYTES // 4)  # weights come from memory
                kb.set(acc, fma(kb, av, kb.vload(w, at, vb), kb.get(acc)))
        return [kb.get(acc) for acc in accs]

    if full:
        with parallel_for(kb, m_n * (full // group), "blocks", work=m_n * n_n * k_n) as item:
            m, nb0 = item // (full // group), item % (full // group) * group
            for g, value in enumerate(block(m, nb0, group, bias is not None)):
                n0 = (nb0 + g) * vb
                index = kb.unflatten(m, out.type.shape[:-1]) + [n0]
                value = apply_epilogue(kb, epilogue, value, index)
                kb.vstore(out, m * n_n + n0, value)
    if n_n % vb:  # the last, partial block: a few outputs, serially, lane by lane
        with kb.loop(0, m_n, "mt") as m:
            (value,) = block(m, full, 1, False)
            for lane in range(n_n % vb):
                x = kb.lane(value, lane)
                n = full * vb + lane
                if bias:
                    x = kb.fadd(x, kb.load(bias, n))
                if epilogue is not None:
                    x = epilogue(x, kb.unflatten(m, out.type.shape[:-1]) + [n])
                kb.store(out, m * n_n + n, x)


register("dense_packed", "anchor", _infer, lower=_lower)
