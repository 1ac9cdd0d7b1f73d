"""attention with runtime sequence lengths (docs/vm.md, "Symbolic dimensions"): the
lowering of an attention kernel whose Sq and Sk are symbolic, which a kernel over
symbolic rows cannot compute (the scores run along Sk).

One pass per query row (an online softmax): for each k position the score s, the
running maximum m and sum l, and the output accumulator rescaled by exp(m_old - m)
when the maximum grows; the row is divided by l at the end. Nothing is sized by the
sequence length (the accumulator holds Dv floats, a static size), so one kernel
serves every length. The loops are plain (no thread team yet): the parallel body is
an outlined function that cannot read the runtime dimensions of this one.
"""

from __future__ import annotations

from pipeline.ops.geometry import logical_shapes


def lower_attention_dims(kb, node, ins, out, epilogue=None, shapes=None) -> None:
    """out = softmax(Q Kᵀ * scale [+ mask]) V for the operands in their perms
    (pipeline/kernels/attention.py); shapes may hold Index values. (FuseOps never
    gives attention an epilogue: it is opaque.)"""
    assert epilogue is None, "attention has no epilogue"
    q, k, v = ins[:3]
    mask = ins[3] if len(ins) > 3 else None
    (bn, hn, sq, d), (_, _, _, sk), (_, _, _, dv) = logical_shapes(
        [t.type.shape for t in ins], node)
    qs, ks, vs = (tuple(buf.strides[p] for p in node.attr(f"{n}_perm"))
                  for buf, n in zip(ins, "qkv", strict=False))
    out_perm = node.attr("out_perm")
    os_ = tuple(out.strides[out_perm.index(u)] for u in range(4))
    scale = kb.f32(node.attr("scale"))
    acc = kb.scratch(dv)
    m_slot, l_slot = kb.local(kb.f32(0.0)), kb.local(kb.f32(0.0))
    with kb.loop(0, bn, "b") as b, kb.loop(0, hn, "h") as h, kb.loop(0, sq, "i") as i:
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
            if mask is not None:
                s = kb.fadd(s, kb.load_broadcast(mask, [b, h, i, j]))
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
