"""Integer convolution and matrix product: ConvInteger, MatMulInteger, QLinearConv,
QLinearMatMul (the portable kernels; the AVX-512 VNNI one is qconv_blocked.py).

Graph ops, int8/uint8 operands with int32 accumulation:
  conv2d_integer(x, w, x_zp, w_zp[, bias, multiplier, y_zp])
  matmul_integer(a, b, a_zp, b_zp[, bias, multiplier, y_zp])
Zero points are tensors (DynamicQuantizeLinear computes them at run time): x_zp and
a_zp of one element, w_zp of one or OC elements, b_zp of one or N. With the three
requantization inputs (attr `out` a quantized type) the int32 sum acc becomes
saturate(roundeven((acc + bias) * multiplier) + y_zp), multiplier =
x_scale * w_scale / y_scale per output channel (or column), computed at build
time; with `out` float32, (acc + bias) * multiplier (QGemm without y_scale);
without them the output is the int32 sum.
"""

from __future__ import annotations

from pipeline.dsl.builder import F32, I32
from pipeline.dsl.vector import parallel_for
from pipeline.kernels.quant import saturate_to, to_i32
from pipeline.kernels.registry import lowering


def _element(kb, buf, index):
    """buf[index] for a per-channel tensor, buf[0] for a one-element one."""
    return kb.load(buf, 0 if buf.type.size == 1 else index)


def requantize(kb, node, acc, ins, channel):
    """The output value of int32 sum `acc` for output channel/column `channel`."""
    if len(ins) <= 4:
        return acc
    bias, mult, yzp = ins[4], ins[5], ins[6] if len(ins) > 6 else None
    acc = kb.b.add(acc, _element(kb, bias, channel))
    r = kb.fmul(kb.b.sitofp(acc, F32), _element(kb, mult, channel), fast=False)
    out = node.attr("out")
    if out == "float32":
        return r
    r = kb.fadd(kb.intrinsic("roundeven", r),
                kb.b.sitofp(to_i32(kb, kb.load(yzp, 0), out), F32), fast=False)
    return saturate_to(kb, r, out)


def _conv_lower(kb, node, ins, out, epilogue):
    x, w, xzp, wzp = ins[:4]
    n_n, c, h, wd = x.type.shape
    oc_n, icg, kh_n, kw_n = w.type.shape
    _, _, oh_n, ow_n = out.type.shape
    (sh, sw), (dh, dw) = node.attr("strides"), node.attr("dilations")
    pt, pl = node.attr("pads")[:2]
    ocg = oc_n // node.attr("groups")
    xt, wt = x.type.dtype, w.type.dtype
    work = out.type.size * icg * kh_n * kw_n
    with parallel_for(kb, n_n * oc_n, "planes", work=work) as item:
        n, oc = item // oc_n, item % oc_n
        x_zero = to_i32(kb, kb.load(xzp, 0), xt)
        w_zero = to_i32(kb, _element(kb, wzp, oc), wt)
        g = oc // ocg
        with kb.loop(0, oh_n, "oh") as oh, kb.loop(0, ow_n, "ow") as ow:
            acc = kb.local(kb.const(0, I32))
            with kb.loop(0, icg, "ic") as ic, kb.loop(0, kh_n, "kh") as kh, \
                    kb.loop(0, kw_n, "kw") as kw:
                ih = oh * sh - pt + kh * dh
                iw = ow * sw - pl + kw * dw
                ok = kb.and_(kb.below(ih, h), kb.below(iw, wd))
                at = ((n * c + g * icg + ic) * h + ih) * wd + iw
                xv = to_i32(kb, kb.load(x, kb.select(ok, at, 0)), xt)
                wv = to_i32(kb, kb.load(w, ((oc * icg + ic) * kh_n + kh) * kw_n + kw), wt)
                prod = kb.b.mul(kb.b.sub(xv, x_zero), kb.b.sub(wv, w_zero))
                kb.set(acc, kb.b.add(kb.get(acc), kb.select(ok, prod, kb.const(0, I32))))
            kb.store(out, ((n * oc_n + oc) * oh_n + oh) * ow_n + ow,
                     requantize(kb, node, kb.get(acc), ins, oc))


lowering("conv2d_integer", lower=_conv_lower)


def _matmul_lower(kb, node, ins, out, epilogue):
    """Row by row: acc[n] += (a[m, k] - a_zp) * (b[k, n] - b_zp[n]), the n loop
    innermost and contiguous (it vectorises)."""
    a, b, azp, bzp = ins[:4]
    *_, m_n, k_n = a.type.shape
    n_n = b.type.shape[-1]
    rows = a.type.size // k_n
    batched = len(b.type.shape) > 2
    at, bt = a.type.dtype, b.type.dtype
    with parallel_for(kb, rows, "rows", work=rows * n_n * k_n) as row:
        acc = kb.scratch(n_n, "int32")
        b_base = (row // m_n) * (k_n * n_n) if batched else 0
        a_zero = to_i32(kb, kb.load(azp, 0), at)
        with kb.loop(0, n_n, "z") as j:
            kb.store(acc, j, kb.const(0, I32))
        with kb.loop(0, k_n, "k") as k:
            av = kb.b.sub(to_i32(kb, kb.load(a, row * k_n + k), at), a_zero)
            with kb.loop(0, n_n, "n") as j:
                bv = kb.b.sub(to_i32(kb, kb.load(b, b_base + k * n_n + j), bt),
                              to_i32(kb, _element(kb, bzp, j), bt))
                kb.store(acc, j, kb.b.add(kb.load(acc, j), kb.b.mul(av, bv)))
        with kb.loop(0, n_n, "o") as j:
            kb.store(out, row * n_n + j, requantize(kb, node, kb.load(acc, j), ins, j))


lowering("matmul_integer", lower=_matmul_lower)
