"""attention with runtime sequence lengths (docs/vm.md, "Symbolic dimensions"): the
lowering of an attention kernel whose Sq and Sk are symbolic, which a kernel over
symbolic rows cannot compute (the scores run along Sk).

One pass per query row (an online softmax): for each k position the score s, the
running maximum m and sum l, and the output accumulator rescaled by exp(m_old - m)
when the maximum grows; the row is divided by l at the end. Nothing is sized by the
sequence length (the accumulator holds Dv floats, a static size), so one kernel
serves every length. The heads are split over the thread team (their count is
static); the body re-reads the runtime dimensions in its own function.
"""

from __future__ import annotations

import contextlib

from pipeline.dsl.vector import parallel_for
from pipeline.ir.graph import row_major_strides
from pipeline.ops.geometry import logical_shapes

# The work a head stands for when the team is sized (the runtime lengths are unknown
# at build time: enough for every thread to take part).
WORK_PER_HEAD = 1 << 20


def lower_attention_dims(kb, node, ins, out, epilogue=None, shapes=None) -> None:
    """out = softmax(Q Kᵀ * scale [+ mask]) V for the operands in their perms
    (pipeline/kernels/attention.py); shapes may hold Index values. The heads (a
    static count) are split over the thread team; each body re-reads the runtime
    dimensions (`shapes`, dsl/dims.py). (FuseOps never gives attention an epilogue:
    it is opaque.)"""
    assert epilogue is None, "attention has no epilogue"
    (_, hn, _, _), _, _ = logical_shapes([t.type.shape for t in ins], node)
    if not isinstance(hn, int) or shapes is None:
        _attention(kb, node, ins, out, [t.type for t in (*ins, out)], None)
        return
    with parallel_for(kb, hn, "heads", work=hn * WORK_PER_HEAD) as h:
        _attention(kb, node, ins, out, shapes(), h)


def _attention(kb, node, ins, out, types, head) -> None:
    """The loops of lower_attention_dims for every head, or for `head` alone; types:
    the buffers' types with Index shapes valid in the function being built."""
    q, k, v = ins[:3]
    mask = ins[3] if len(ins) > 3 else None
    (bn, hn, sq, d), (_, _, _, sk), (_, _, _, dv) = logical_shapes(
        [t.shape for t in types[:3]], node)
    strides = [row_major_strides(t.shape) for t in types]
    qs, ks, vs = (tuple(strides[n][p] for p in node.attr(f"{name}_perm"))
                  for n, name in enumerate("qkv"))
    out_perm = node.attr("out_perm")
    os_ = tuple(strides[-1][out_perm.index(u)] for u in range(4))
    scale = kb.f32(node.attr("scale"))
    acc = kb.scratch(dv)
    m_slot, l_slot = kb.local(kb.f32(0.0)), kb.local(kb.f32(0.0))
    heads = kb.loop(0, hn, "h") if head is None else contextlib.nullcontext(head)
    with kb.loop(0, bn, "b") as b, heads as h, kb.loop(0, sq, "i") as i:
        q0 = b * qs[0] + h * qs[1] + i * qs[2]
        k0, v0 = b * ks[0] + h * ks[1], b * vs[0] + h * vs[1]
        kb.set(m_slot, kb.f32(-3.0e38))
        kb.set(l_slot, kb.f32(0.0))
        with kb.loop(0, dv, "e") as e:
            kb.store(acc, e, kb.f32(0.0))
        with kb.loop(0, sk, "j") as j:
            score = kb.local(kb.f32(0.0))
            with kb.loop(0, d, "c") as c:
                kb.set(score, kb.fadd(kb.get(score), kb.fmul(
                    kb.load(q, q0 + c * qs[3]), kb.load(k, k0 + c * ks[2] + j * ks[3]))))
            s = kb.fmul(kb.get(score), scale)
            if mask is not None:  # broadcast to [B, H, Sq, Sk]: a dim of 1 does not move
                shape = types[3].shape
                at = kb.dot([b, h, i, j][4 - len(shape):],
                            [0 if isinstance(n, int) and n == 1 else st
                             for n, st in zip(shape, strides[3], strict=True)])
                s = kb.fadd(s, kb.load(mask, at))
            m_old = kb.get(m_slot)
            m_new = kb.fmax(m_old, s)
            rescale, p = kb.exp(kb.fsub(m_old, m_new)), kb.exp(kb.fsub(s, m_new))
            kb.set(m_slot, m_new)
            kb.set(l_slot, kb.fadd(kb.fmul(kb.get(l_slot), rescale), p))
            with kb.loop(0, dv, "e") as e:
                kb.store(acc, e, kb.fadd(kb.fmul(kb.load(acc, e), rescale),
                                         kb.fmul(p, kb.load(v, v0 + j * vs[2] + e * vs[3]))))
        o0 = b * os_[0] + h * os_[1] + i * os_[2]
        inv = kb.fdiv(kb.f32(1.0), kb.get(l_slot))
        with kb.loop(0, dv, "e") as e:
            kb.store(out, o0 + e * os_[3], kb.fmul(kb.load(acc, e), inv))
