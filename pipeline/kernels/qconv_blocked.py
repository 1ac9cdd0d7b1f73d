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
-- AVX-512 VNNI's or AVX-VNNI's vpdpbusd (attr dot="vnni"), AArch64's sdot with +dotprod
(dot="sdot", s8 x s8), an Arm M-profile core's DSP extension (dot="smlad": SXTB16 and
SMLAD, qarm_dsp.py; two output columns per tile, as its 13 registers hold), MVE
(dot="mve": VLDRB and VMLAVA, one column per tile), else the same sum written with
widening multiplies and shuffles (dot="portable", which any target legalises). A tile
keeps T output columns x K channel blocks of accumulators in registers, like
conv2d_nchwc.

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
from pipeline.dsl.vector import (
    ELEMENT_WORK,
    apply_epilogue,
    band_items,
    band_plane_row,
    parallel_for,
)
from pipeline.kernels import qarm_dsp
from pipeline.kernels.conv_blocked import registers
from pipeline.kernels.registry import lowering
from pipeline.ops.geometry import QTYPES

I8 = ir.IntType(8)


DOTS = ("vnni", "sdot", "mve", "smlad", "portable")


# x86 CPUs with AVX-512 VNNI, for targets that name one without -mattr.
_VNNI_CPUS = {"cascadelake", "cooperlake", "icelake-server", "icelake-client", "tigerlake",
              "sapphirerapids", "emeraldrapids", "graniterapids", "znver4", "znver5"}


# x86 CPUs with AVX-VNNI (256-bit, VEX) but no AVX-512.
_AVX_VNNI_CPUS = {"alderlake", "raptorlake", "meteorlake", "arrowlake", "arrowlake-s",
                  "lunarlake", "gracemont", "sierraforest", "grandridge", "clearwaterforest"}


# AArch64 cores with the dot-product extension (Armv8.2 DotProd), for targets that
# name a cpu without -mattr=+dotprod.
_DOTPROD_CPUS = {"cortex-a55", "cortex-a65", "cortex-a75", "cortex-a76", "cortex-a77",
                 "cortex-a78", "cortex-a710", "cortex-x1", "cortex-x2", "neoverse-n1",
                 "neoverse-n2", "neoverse-v1", "neoverse-v2", "apple-m1", "apple-m2"}


def dot_kind(target) -> str:
    """The dot product a target has: "vnni" (x86 with AVX-512 VNNI at 16 lanes, or
    AVX-VNNI's VEX form at 8), "sdot" (AArch64 with +dotprod, given or implied by its
    cpu), "mve" (an Arm M-profile core with MVE), "smlad" (one with the DSP
    extension), else "portable" (always for the c target: plain C has no dot
    instruction)."""
    if target.kind == "c":
        return "portable"
    feats = set(target.features.split(","))
    if target.vector_width == 16 and "-avx512vnni" not in feats and (
            "+avx512vnni" in feats or target.cpu in _VNNI_CPUS):
        return "vnni"
    if target.vector_width == 8 and "-avxvnni" not in feats and (
            "+avxvnni" in feats or target.cpu in _AVX_VNNI_CPUS):
        return "vnni"
    if target.arch == "aarch64" and "-dotprod" not in feats and (
            "+dotprod" in feats or target.cpu in _DOTPROD_CPUS):
        return "sdot"
    if qarm_dsp.has_mve(target):
        return "mve"
    if qarm_dsp.has_dsp(target):
        return "smlad"
    return "portable"


def offset_of(dot: str, x_dtype: str) -> int:
    """What the kernel adds to every input byte so the dot instruction's signs fit
    (smlad and mve widen either sign: nothing)."""
    if dot in ("smlad", "mve"):
        return 0
    if dot == "sdot":
        return -128 if x_dtype == "uint8" else 0
    return 128 if x_dtype == "int8" else 0


def input_block(channels: int, vw: int) -> int:
    """ib for C channels: C rounded up to 4, then the widest of vw, 16, 8, 4 dividing it."""
    c4 = -(-channels // 4) * 4
    return next(b for b in (vw, 16, 8, 4) if b <= vw and c4 % b == 0)


SMLAD_COLUMNS = 2  # columns per tile: 8 accumulators; 3 spilled around each SMLAD


def tile(ow: int, oc_blocks: int, vw: int, dot: str = "portable") -> tuple[int, int]:
    """(K, T): channel blocks and output columns per register tile (smlad, mve: one
    block, their accumulators are general-purpose registers; VMLAVA's even ones)."""
    if dot == "smlad":
        return 1, min(ow, SMLAD_COLUMNS)
    if dot == "mve":
        return 1, 1
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
    # Row bands (band_plane_row), as the convs before and after split their rows: at
    # two threads each copies the rows it wrote itself, for the rows it will read (by
    # channel blocks, half of each thread's copies came from the other core's cache:
    # the pads took 2-4x longer at two threads than at one).
    with parallel_for(kb, band_items(n_n, cb_n, hp), "rows",
                      work=out.type.size * ELEMENT_WORK) as item, \
            band_plane_row(kb, item, n_n, cb_n, hp) as (n, cb, oh):
        ih = oh - pt
        row = ((n * cb_n + cb) * hp + oh) * (wp * ib)
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


def _window_lower(kb, node, ins, out, epilogue):
    """qpad_nchwc with attr window (a one-channel input, M-profile cores): pixel
    (h, w) of the output holds the padded input's columns w..w+3, the fill value past
    the border and in channels from `window` on."""
    x = ins[0]
    (pt, pl, _, _), window = node.attr("pads"), node.attr("window")
    fill = ir.Constant(I8, node.attr("fill") & 0xFF)
    n_n, _, hp, wp, ib = out.type.shape
    h, w = x.type.shape[-2], x.type.shape[-1]
    with parallel_for(kb, n_n * hp, "rows", work=out.type.size) as item:
        n, ih = item // hp, item % hp - pt
        with kb.loop(0, wp, "w") as col:
            for j in range(ib):
                iw = col + (j - pl)
                inside = kb.and_(kb.below(ih, h), kb.below(iw, w))
                at = kb.select(inside, (n * h + ih) * w + iw, 0)
                value = kb.b.trunc(kb.load(x, at), I8) if j < window else fill
                if j < window:
                    value = kb.b.select(inside, value, fill)
                kb.store(out, (item * wp + col) * ib + j, value)


def _pad_or_window(kb, node, ins, out, epilogue):
    if node.attr("window"):
        return _window_lower(kb, node, ins, out, epilogue)
    return _pad_lower(kb, node, ins, out, epilogue)


lowering("qpad_nchwc", lower=_pad_or_window)


def _declare(module, name, ret, args):
    fn = module.globals.get(name)
    return fn if fn is not None else ir.Function(module, ir.FunctionType(ret, args), name=name)


def load_weights(kb, kind: str, w, at, lanes: int):
    """dot()'s weights: the 4 * lanes bytes at w[at..] as one vector, or for mve a
    list of each lane's four bytes, each a load of its own (VLDRB.S32; taken out of
    one vector they were moved byte by byte)."""
    if kind == "mve":
        v4 = ir.VectorType(I8, 4)
        return [kb.b.load(kb.gep(w, at + 4 * lane), typ=v4, align=1) for lane in range(lanes)]
    return kb.b.load(kb.gep(w, at), typ=ir.VectorType(I8, 4 * lanes), align=1)


def broadcast(kb, kind: str, word, lanes: int):
    """dot()'s input: four bytes (an i32) repeated over the lanes as <4L x i8>, or
    for mve once, as <4 x i8>."""
    if kind == "mve":
        return kb.b.bitcast(word, ir.VectorType(I8, 4))
    return kb.b.bitcast(kb.splat(word, lanes), ir.VectorType(I8, 4 * lanes))


def dot(kb, kind: str, acc, xv, wv, x_signed: bool = False):
    """acc[l] + sum over j < 4 of x[4l + j] * w[4l + j], both <4L x i8> (x unsigned
    but for smlad with x_signed; mve: broadcast() and load_weights() operands)."""
    if kind == "smlad":
        return qarm_dsp.dot4_lanes(kb, acc, xv, wv, x_signed)
    if kind == "mve":
        return qarm_dsp.mve_dot4_lanes(kb, acc, xv, wv, x_signed)
    lanes = acc.type.count
    v8 = ir.VectorType(I8, 4 * lanes)
    if kind == "vnni":  # 512, 256 or 128 bits (AVX512VL or AVX-VNNI's VEX encoding)
        fn = _declare(kb.module, f"llvm.x86.avx512.vpdpbusd.{32 * lanes}", acc.type,
                      [acc.type, v8, v8])
        return kb.b.call(fn, [acc, xv, wv])
    if kind == "sdot":
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
    pt, pl, pb, pr = node.attr("out_pads", (0, 0, 0, 0))
    oh_n, ow_n = oh_n - pt - pb, ow_n - pl - pr
    sh, sw = node.attr("strides")
    kind, k_n = node.attr("dot"), kob // ob
    _, t = tile(ow_n, ocb_n, ob, kind)
    flip = node.attr("offset") != 0
    acc_t = ir.VectorType(I32, ob)
    work = out.type.size * cb_n * ib * kh_n * kw_n
    # Bands of rows outermost (dsl/vector.py band_plane_row), as the float convs and the
    # elementwise kernels after them split: each thread then reads what it wrote (split
    # by channel groups, a residual DequantizeLinear at two threads read half its input
    # from the other core and ran 3x slower than at one).
    with parallel_for(kb, band_items(n_n, ocg_n, oh_n), "rows", work=work) as item, \
            band_plane_row(kb, item, n_n, ocg_n, oh_n) as (n, ocg, oh):
        full = ow_n // t
        if full:
            with kb.loop(0, full, "tile") as j:
                _tile(kb, node, (x, w, bias, mult, yzp, out), (n, ocg, oh, j * t), t, k_n,
                      kind, flip, acc_t, epilogue)
        if ow_n % t:
            _tile(kb, node, (x, w, bias, mult, yzp, out), (n, ocg, oh, full * t), ow_n % t,
                  k_n, kind, flip, acc_t, epilogue)
        if node.attr("out_pads"):
            for k in range(k_n):
                fill_borders(kb, node, out, n * ocb_n + ocg * k_n + k, oh, oh_n)


def _tile(kb, node, bufs, where, width, k_n, kind, flip, acc_t, epilogue):
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
            if kind == "smlad":  # weights lane by lane: two of their halves live at a time
                words = [kb.b.load(kb.gep(x, (x_row + (ow0 + j) * sw + kw) * ib + ic4 * 4),
                                   typ=I32, align=1) for j in range(width)]
                qarm_dsp.dot4_tile(kb, accs, words, w, w_tap + ic4 * kob * 4, ob,
                                   x.type.dtype == "int8")
                continue
            wv = [load_weights(kb, kind, w, w_tap + (ic4 * kob + k * ob) * 4, ob)
                  for k in range(k_n)]
            for j in range(width):
                at = (x_row + (ow0 + j) * sw + kw) * ib + ic4 * 4
                word = kb.b.load(kb.gep(x, at), typ=I32, align=1)
                if flip:
                    word = kb.b.xor(word, ir.Constant(I32, 0x80808080 - (1 << 32)))
                xv = broadcast(kb, kind, word, ob)
                for k in range(k_n):
                    kb.set(accs[k][j], dot(kb, kind, kb.get(accs[k][j]), xv, wv[k],
                                           x.type.dtype == "int8"))
    store = Requantize(kb, node, bias, mult, yzp, ob)
    pt, pl = node.attr("out_pads", (0, 0, 0, 0))[:2]
    for k in range(k_n):
        oc0 = (ocg * k_n + k) * ob
        for j in range(width):
            index = [n, ocg * k_n + k, oh, ow0 + j, 0]  # (the epilogue's: unpadded)
            at = kb.dot([n, ocg * k_n + k, oh + pt, ow0 + j + pl], out.strides[:4])
            store(kb.get(accs[k][j]), oc0, out, at, epilogue=(epilogue, index))


def fill_borders(kb, node, out, plane, oh, oh_n: int) -> None:
    """attr out_pads (transform/padded_outputs.py): the border pixels of output row
    oh (< oh_n) of `plane`, the flat (image, channel block) index, hold out_fill: the
    row's left and right ones, and with the first row the rows above, with the last
    the rows below."""
    pt, pl, pb, pr = node.attr("out_pads")
    _, _, hp, wp, ob = out.type.shape
    fill = ir.Constant(ir.VectorType(I8, ob), [node.attr("out_fill") & 0xFF] * ob)

    def put(row, col) -> None:
        kb.b.store(fill, kb.gep(out, ((plane * hp + row) * wp + col) * ob), align=1)

    for col in [*range(pl), *range(wp - pr, wp)]:
        put(oh + pt, col)
    for edge, rows in ((oh < 1, range(pt)), (oh >= oh_n - 1, range(pt + oh_n, hp))):
        if rows:
            with kb.if_(edge):
                for row in rows:
                    with kb.loop(0, wp, "border") as col:
                        put(row, col)


class Requantize:
    """saturate(roundeven((acc + bias) * multiplier) + y_zp) of an int32 vector of
    output channels oc0.., stored as bytes.

    Cortex-M4's FPv4 has no rounding, minimum or maximum instruction (roundeven,
    minnum and maxnum are libm calls there), so a kernel of dot="smlad" rounds by
    adding and subtracting 1.5 * 2^23 in the FPU's round-to-nearest-even (exact up
    to 2^22; beyond that the value saturates anyway, so the stored bytes are the
    same) and clamps with compares (the value is never NaN)."""

    def __init__(self, kb, node, bias, mult, yzp, ob: int):
        self.kb, self.bias, self.mult, self.ob = kb, bias, mult, ob
        self.acc_t, self.f_t = ir.VectorType(I32, ob), ir.VectorType(F32, ob)
        out = node.attr("out")
        zp = kb.load(yzp, 0)  # widened to i32 by its sign
        self.zero = kb.splat(kb.b.sitofp(zp, F32), ob)
        lo, hi = QTYPES[out]
        self.lo = ir.Constant(self.f_t, [float(lo)] * ob)
        self.hi = ir.Constant(self.f_t, [float(hi)] * ob)
        self.magic = ir.Constant(self.f_t, [12582912.0] * ob) \
            if node.attr("dot") == "smlad" else None

    def __call__(self, acc, oc0, out, at, lanes: int | None = None,
                 epilogue: tuple = (None, None)) -> None:
        """Store the first `lanes` (default all) requantized values at out[at..], through
        the fused `epilogue` (the Epilogue and the output index of the first lane)."""
        kb, ob = self.kb, self.ob
        b_v = kb.b.load(kb.gep(self.bias, oc0), typ=self.acc_t, align=4)
        m_v = kb.b.load(kb.gep(self.mult, oc0), typ=self.f_t, align=4)
        f = kb.fmul(kb.b.sitofp(kb.b.add(acc, b_v), self.f_t), m_v, fast=False)
        r = kb.intrinsic("roundeven", f) if self.magic is None else kb.fsub(
            kb.fadd(f, self.magic, fast=False), self.magic, fast=False)
        r = kb.fadd(r, self.zero, fast=False)
        if self.magic is None:
            r = kb.intrinsic("minnum", kb.intrinsic("maxnum", r, self.lo), self.hi)
        else:
            r = kb.b.select(kb.b.fcmp_ordered("<", r, self.lo), self.lo, r)
            r = kb.b.select(kb.b.fcmp_ordered(">", r, self.hi), self.hi, r)
        q = kb.b.trunc(kb.b.fptosi(r, self.acc_t), ir.VectorType(I8, ob))
        if epilogue[0]:  # its result is in the compute type (int8: i32), vstore narrows
            kb.vstore(out, at, apply_epilogue(kb, epilogue[0], q, epilogue[1]))
            return
        if lanes is None or lanes == ob:
            kb.b.store(q, kb.gep(out, at), align=1)
            return
        for lane in range(lanes):  # a partial last block (qdense_packed)
            kb.b.store(kb.lane(q, lane), kb.gep(out, at + lane), align=1)


lowering("qconv2d_nchwc", lower=_lower)


def pack_qdepthwise(w: np.ndarray, vw: int) -> np.ndarray:
    """int8 [C, 1, KH, KW] -> [C/vw, KH, KW, vw]."""
    c, _, kh, kw = w.shape
    return np.ascontiguousarray(w.reshape(c // vw, vw, kh, kw).transpose(0, 2, 3, 1))


DSP_DEPTHWISE_COLUMNS = 1  # per tile on the DSP extension: 4 accumulators each


def _dw_lower(kb, node, ins, out, epilogue):
    """One filter per channel: per output row, tiles of T columns, each tap a widening
    multiply-add of b channels (no dot product: nothing to sum across lanes)."""
    x, w, bias, mult, yzp = ins
    n_n, cb_n, hp, wp, ob = x.type.shape
    _, kh_n, kw_n, _ = w.type.shape
    _, _, oh_p, ow_p, _ = out.type.shape
    pt, pl, pb, pr = node.attr("out_pads", (0, 0, 0, 0))  # out_pads: not with `dot`
    oh_n, ow_n = oh_p - pt - pb, ow_p - pl - pr
    sh, sw = node.attr("strides")
    kind = node.attr("dot")  # smlad, mve: four channels a word (ob is 4), borders
    t = DSP_DEPTHWISE_COLUMNS if kind else max(1, min(ow_n, registers(ob) - 4))
    acc_t = ir.VectorType(I32, ob)
    v8 = ir.VectorType(I8, ob)
    signed = x.type.dtype == "int8"
    smlad = kind == "smlad"
    with parallel_for(kb, n_n * cb_n * oh_n, "rows", work=out.type.size * kh_n * kw_n) as item:
        plane, oh = item // oh_n, item % oh_n
        cb = plane % cb_n
        store = Requantize(kb, node, bias, mult, yzp, ob)
        if kind and kh_n * kw_n > qarm_dsp.UNROLLED_TAPS:
            taps = None  # loaded in depthwise_tile's loop over the rows
        elif kind:
            taps = [qarm_dsp.depthwise_tap(kb, w, ((cb * kh_n + kh) * kw_n + kw) * ob, smlad)
                    for kh in range(kh_n) for kw in range(kw_n)]
        else:
            taps = [kb.b.load(kb.gep(w, ((cb * kh_n + kh) * kw_n + kw) * ob), typ=v8,
                              align=1) for kh in range(kh_n) for kw in range(kw_n)]
            taps = [kb.b.sext(v, acc_t) for v in taps]

        def tile(ow0, width):
            if kind:
                return qarm_dsp.depthwise_tile(kb, node, (x, w, out), (plane, oh, ow0),
                                               width, (kh_n, kw_n, sh, sw), taps, store, cb)
            accs = [ir.Constant(acc_t, [0] * ob)] * width
            for kh in range(kh_n):
                row = (plane * hp + oh * sh + kh) * wp
                for kw in range(kw_n):
                    wv = taps[kh * kw_n + kw]
                    for j in range(width):
                        at = (row + (ow0 + j) * sw + kw) * ob
                        xv = kb.b.load(kb.gep(x, at), typ=v8, align=1)
                        xv = kb.b.sext(xv, acc_t) if signed else kb.b.zext(xv, acc_t)
                        accs[j] = kb.b.add(accs[j], kb.b.mul(xv, wv))
            for j in range(width):
                store(accs[j], cb * ob, out, ((plane * oh_p + oh + pt) * ow_p + ow0 + j + pl) * ob)

        full = ow_n // t
        if full:
            with kb.loop(0, full, "tile") as j:
                tile(j * t, t)
        if ow_n % t:
            tile(full * t, ow_n % t)
        if node.attr("out_pads"):
            fill_borders(kb, node, out, plane, oh, oh_n)


lowering("qdepthwise_conv2d_nchwc", lower=_dw_lower)
