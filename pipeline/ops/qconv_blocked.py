"""qconv2d_nchwc: the int8 convolution on channel-blocked tensors, with the target's
dot-product instructions; qpad_nchwc: its padded, blocked input.

Layouts (b = the target's vector width in floats, ib = input block, a multiple of 4):
  x    [N, C'/ib, H + pt + pb, W + pl + pr, ib]  uint8/int8, padded with the zero
                                                 point (qpad_nchwc), C' = C rounded up to 4
  w    [OC/(K*b), C'/ib, KH, KW, ib/4, K*b, 4]   int8, packed at build time (pack_qweight)
  bias [OC] int32, multiplier [OC] float32, y_zp a scalar
  out  [N, OC/b, OH, OW, b]                      uint8/int8

One step of the micro-kernel takes four input channels of a pixel (one 32-bit
broadcast) against four weights of each of b output channels (a 4b-byte vector):
per output lane, the sum of four u8 x s8 products, added to an int32 accumulator
-- AVX-512 VNNI's vpdpbusd (attr dot="vnni"), AArch64's sdot with +dotprod
(dot="sdot", s8 x s8), else the same sum written with widening multiplies and
shuffles (dot="portable", which any target legalises). A tile keeps T output
columns x K channel blocks of accumulators in registers, like conv2d_nchwc.

Operand signs and zero points: vpdpbusd multiplies unsigned by signed bytes, so an
int8 input is moved to uint8 by flipping its top bit (x + 128), and sdot wants
both signed, so a uint8 input becomes x - 128 the same way. The product sum then
differs from sum((x - zx) * w) by a per-channel constant, (zx + offset) * sum(w),
which pack_qweight folds into the bias with the quantizer's bias. Padding holds
zx itself, so padded taps contribute (zx - zx) * w = 0 and no border tile is
special. The weights' zero point must be 0 (symmetric int8 weights).

After the reduction: saturate(roundeven((acc + bias) * multiplier) + y_zp), stored
as b bytes.
"""

from __future__ import annotations

import llvmlite.ir as ir
import numpy as np

from pipeline.dsl.builder import F32, I32
from pipeline.dsl.vector import parallel_for
from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.conv_blocked import registers
from pipeline.ops.quant import QTYPES
from pipeline.ops.registry import register

I8 = ir.IntType(8)
DOTS = ("vnni", "sdot", "portable")


# AArch64 cores with the dot-product extension (Armv8.2 DotProd), for targets that
# name a cpu without -mattr=+dotprod.
_DOTPROD_CPUS = {"cortex-a55", "cortex-a65", "cortex-a75", "cortex-a76", "cortex-a77",
                 "cortex-a78", "cortex-a710", "cortex-x1", "cortex-x2", "neoverse-n1",
                 "neoverse-n2", "neoverse-v1", "neoverse-v2", "apple-m1", "apple-m2"}


def dot_kind(target) -> str:
    """The dot product a target has: "vnni" (x86 with AVX-512 VNNI at 16 lanes),
    "sdot" (AArch64 with +dotprod, given or implied by its cpu), else "portable"."""
    feats = set(target.features.split(","))
    if target.vector_width == 16 and "+avx512vnni" in feats:
        return "vnni"
    if target.arch == "aarch64" and "-dotprod" not in feats and (
            "+dotprod" in feats or target.cpu in _DOTPROD_CPUS):
        return "sdot"
    return "portable"


def offset_of(dot: str, x_dtype: str) -> int:
    """What the kernel adds to every input byte so the dot instruction's signs fit."""
    if dot == "sdot":
        return -128 if x_dtype == "uint8" else 0
    return 128 if x_dtype == "int8" else 0


def input_block(channels: int, vw: int) -> int:
    """ib for C channels: C rounded up to 4, then the widest of vw, 16, 8, 4 dividing it."""
    c4 = -(-channels // 4) * 4
    return next(b for b in (vw, 16, 8, 4) if b <= vw and c4 % b == 0)


def tile(ow: int, oc_blocks: int, vw: int) -> tuple[int, int]:
    """(K, T): channel blocks and output columns per register tile."""
    best = None
    for k in (1, 2, 4):
        if oc_blocks % k:
            continue
        widest = max(1, (registers(vw) - k - 1) // k)
        t = -(-ow // -(-ow // widest))
        key = (t * k, -(t + k))
        if best is None or key > best[0]:
            best = (key, (k, t))
    return best[1]


def pack_qweight(w: np.ndarray, ib: int, vw: int, k: int) -> np.ndarray:
    """int8 OIHW -> [OC/(k*vw), C'/ib, KH, KW, ib/4, k*vw, 4], input channels zero-padded
    to C' (a multiple of ib)."""
    oc, c, kh, kw = w.shape
    cp = -(-c // ib) * ib
    padded = np.zeros((oc, cp, kh, kw), np.int8)
    padded[:, :c] = w
    g = padded.reshape(oc // (k * vw), k * vw, cp // ib, ib // 4, 4, kh, kw)
    return np.ascontiguousarray(g.transpose(0, 2, 5, 6, 3, 1, 4))


def corrected_bias(w: np.ndarray, bias: np.ndarray, x_zero: int, offset: int) -> np.ndarray:
    """bias - (zx + offset) * sum(w) per output channel (see the module docstring)."""
    sums = w.reshape(w.shape[0], -1).astype(np.int64).sum(axis=1)
    return (bias.astype(np.int64) - (int(x_zero) + offset) * sums).astype(np.int32)


# -- qpad_nchwc ----------------------------------------------------------------------------

def _pad_infer(types, node):
    x = types[0]
    ib, (pt, pl, pb, pr) = node.attr("block"), node.attr("pads")
    channels = node.attr("channels")
    n, _, h, w = x.shape[:4]
    cp = -(-channels // ib) * ib
    return [TensorType((n, cp // ib, h + pt + pb, w + pl + pr, ib), x.dtype)]


def _pad_lower(kb, node, ins, out, epilogue):
    """Row by row: the border rows and columns and the channels past C hold the fill
    value; a blocked input with the same block is copied a row at a time."""
    x = ins[0]
    ib, (pt, pl, _, _) = node.attr("block"), node.attr("pads")
    channels, fill = node.attr("channels"), ir.Constant(I8, node.attr("fill") & 0xFF)
    n_n, cb_n, hp, wp, _ = out.type.shape
    blocked = len(x.type.shape) == 5
    h, w = x.type.shape[2], x.type.shape[3]
    b0 = x.type.shape[4] if blocked else 0
    with parallel_for(kb, n_n * cb_n * hp, "rows", work=out.type.size) as item:
        n, rest = item // (cb_n * hp), item % (cb_n * hp)
        cb, oh = rest // hp, rest % hp
        ih = oh - pt
        row = item * (wp * ib)
        with kb.loop(0, wp * ib, "f") as j:
            kb.store(out, row + j, fill)
        with kb.if_(kb.below(ih, h)):
            if blocked and b0 == ib:
                src = ((n * x.type.shape[1] + cb) * h + ih) * (w * ib)
                with kb.loop(0, w * ib, "c") as j:
                    kb.store(out, row + pl * ib + j, kb.load(x, src + j))
            else:
                with kb.loop(0, w, "iw") as iw, kb.loop(0, ib, "i") as i:
                    c = cb * ib + i
                    with kb.if_(kb.below(c, channels)):
                        if blocked:
                            at = ((n * x.type.shape[1] + c // b0) * h + ih) * (w * b0) + \
                                iw * b0 + c % b0
                        else:
                            at = ((n * channels + c) * h + ih) * w + iw
                        kb.store(out, row + (iw + pl) * ib + i, kb.load(x, at))


register("qpad_nchwc", "opaque", _pad_infer, lower=_pad_lower)


# -- qconv2d_nchwc -------------------------------------------------------------------------

def _infer(types, node):
    x, w = types[0], types[1]
    n, cb, hp, wp, ib = x.shape
    ocg, wcb, kh, kw, ib4, kob, four = w.shape
    ob = node.attr("oc_block")
    if (wcb, ib4 * 4, four) != (cb, ib, 4) or kob % ob or x.dtype not in QTYPES:
        raise ModelError(f"node {node.name!r} (qconv2d_nchwc): weights {list(w.shape)} do "
                         f"not match input {list(x.shape)} {x.dtype}")
    sh, sw = node.attr("strides")
    return [TensorType((n, ocg * kob // ob, (hp - kh) // sh + 1, (wp - kw) // sw + 1, ob),
                       node.attr("out"))]


def _declare(module, name, ret, args):
    fn = module.globals.get(name)
    return fn if fn is not None else ir.Function(module, ir.FunctionType(ret, args), name=name)


def _dot(kb, dot: str, acc, xv, wv):
    """acc[l] + sum over j < 4 of x[4l + j] * w[4l + j], both <4L x i8>."""
    lanes = acc.type.count
    v8 = ir.VectorType(I8, 4 * lanes)
    if dot == "vnni":
        fn = _declare(kb.module, "llvm.x86.avx512.vpdpbusd.512", acc.type, [acc.type, v8, v8])
        return kb.b.call(fn, [acc, xv, wv])
    if dot == "sdot":
        fn = _declare(kb.module, f"llvm.aarch64.neon.sdot.v{lanes}i32.v{4 * lanes}i8",
                      acc.type, [acc.type, v8, v8])
        return kb.b.call(fn, [acc, xv, wv])
    wide = ir.VectorType(I32, 4 * lanes)
    prod = kb.b.mul(kb.b.zext(xv, wide), kb.b.sext(wv, wide))
    for j in range(4):
        part = kb.b.shuffle_vector(prod, ir.Constant(wide, None), ir.Constant(
            ir.VectorType(I32, lanes), [4 * lane + j for lane in range(lanes)]))
        acc = kb.b.add(acc, part)
    return acc


def _lower(kb, node, ins, out, epilogue):
    x, w, bias, mult, yzp = ins
    n_n, cb_n, hp, wp, ib = x.type.shape
    ocg_n, _, kh_n, kw_n, _, kob, _ = w.type.shape
    _, ocb_n, oh_n, ow_n, ob = out.type.shape
    sh, sw = node.attr("strides")
    dot, k_n = node.attr("dot"), kob // ob
    _, t = tile(ow_n, ocb_n, ob)
    flip = node.attr("offset") != 0
    acc_t, v8 = ir.VectorType(I32, ob), ir.VectorType(I8, 4 * ob)
    work = out.type.size * cb_n * ib * kh_n * kw_n
    with parallel_for(kb, n_n * ocg_n * oh_n, "rows", work=work) as item:
        n, rest = item // (ocg_n * oh_n), item % (ocg_n * oh_n)
        ocg, oh = rest // oh_n, rest % oh_n
        full = ow_n // t
        if full:
            with kb.loop(0, full, "tile") as j:
                _tile(kb, node, (x, w, bias, mult, yzp, out), (n, ocg, oh, j * t), t, k_n,
                      dot, flip, acc_t, v8)
        if ow_n % t:
            _tile(kb, node, (x, w, bias, mult, yzp, out), (n, ocg, oh, full * t), ow_n % t,
                  k_n, dot, flip, acc_t, v8)


def _tile(kb, node, bufs, where, width, k_n, dot, flip, acc_t, v8):
    x, w, bias, mult, yzp, out = bufs
    n, ocg, oh, ow0 = where
    _, cb_n, hp, wp, ib = x.type.shape
    _, _, kh_n, kw_n, _, kob, _ = w.type.shape
    ob = out.type.shape[4]
    sh, sw = node.attr("strides")
    zeros = ir.Constant(acc_t, [0] * ob)
    accs = [[kb.local(zeros) for _ in range(width)] for _ in range(k_n)]
    with kb.loop(0, cb_n, "icb") as icb, kb.loop(0, kh_n, "kh") as kh, \
            kb.loop(0, kw_n, "kw") as kw:
        x_row = ((n * cb_n + icb) * hp + oh * sh + kh) * wp
        w_tap = (((ocg * cb_n + icb) * kh_n + kh) * kw_n + kw) * (ib * kob)
        for ic4 in range(ib // 4):
            wv = [kb.b.load(kb.gep(w, w_tap + (ic4 * kob + k * ob) * 4), typ=v8, align=1)
                  for k in range(k_n)]
            for j in range(width):
                at = (x_row + (ow0 + j) * sw + kw) * ib + ic4 * 4
                word = kb.b.load(kb.gep(x, at), typ=I32, align=1)
                if flip:
                    word = kb.b.xor(word, ir.Constant(I32, 0x80808080 - (1 << 32)))
                xv = kb.b.bitcast(kb.splat(word, ob), v8)
                for k in range(k_n):
                    kb.set(accs[k][j], _dot(kb, dot, kb.get(accs[k][j]), xv, wv[k]))
    lo, hi = QTYPES[node.attr("out")]
    f_t = ir.VectorType(F32, ob)
    zero = kb.splat(kb.b.sitofp(kb.b.sext(kb.load(yzp, 0), I32) if node.attr("out") == "int8"
                                else kb.b.zext(kb.load(yzp, 0), I32), F32), ob)
    for k in range(k_n):
        oc0 = (ocg * k_n + k) * ob
        b_v = kb.b.load(kb.gep(bias, oc0), typ=acc_t, align=4)
        m_v = kb.b.load(kb.gep(mult, oc0), typ=f_t, align=4)
        for j in range(width):
            f = kb.fmul(kb.b.sitofp(kb.b.add(kb.get(accs[k][j]), b_v), f_t), m_v, fast=False)
            r = kb.fadd(kb.intrinsic("roundeven", f), zero, fast=False)
            r = kb.intrinsic("maxnum", r, ir.Constant(f_t, [float(lo)] * ob))
            r = kb.intrinsic("minnum", r, ir.Constant(f_t, [float(hi)] * ob))
            q = kb.b.trunc(kb.b.fptosi(r, acc_t), ir.VectorType(I8, ob))
            at = (((n * out.type.shape[1] + ocg * k_n + k) * out.type.shape[2] + oh)
                  * out.type.shape[3] + ow0 + j) * ob
            kb.b.store(q, kb.gep(out, at), align=1)


register("qconv2d_nchwc", "opaque", _infer, lower=_lower)
