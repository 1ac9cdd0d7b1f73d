"""conv2d_nchwc: direct convolution on channel-blocked tensors, register-blocked.

Layouts (b = the target's vector width, ib = input block, K = output blocks per tile):
  x    [N, C/ib, H, W, ib]               (NCHW{ib}c)
  w    [OC/(K*b), C/(G*ib), KH, KW, ib, K*b] (packed at build time by transform/layout.py)
  bias [OC]                              (optional; already in blocked order)
  out  [N, OC/b, OH, OW, b]              (NCHW{b}c)

With G groups (attr groups, default 1; each group's channels and filters whole blocks,
its filters whole tiles), the tiles of group g read the input's channel blocks
g*C/(G*ib) onwards: alexnet's two-group convs are this kernel, not the plain conv2d.

The micro-kernel keeps a tile of T output columns x K channel blocks in T*K
vector registers: for every input channel and tap it loads K weight vectors,
broadcasts T input values and issues T*K fused multiply-adds. Work items
(image, output-channel group, output row) are split over threads. Padding never
reaches the inner loops: the kh range is clamped per row, and tiles that touch
the left or right border are generated separately with their out-of-range
taps left out (shapes are static, so that is decided here, in Python).
The epilogue (bias, residual add, relu, ...) runs on the registers before the
single store of each output vector.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.dsl.vector import (
    BANDS,
    apply_epilogue,
    band_of,
    band_row,
    fma,
    parallel_for,
    prefetch,
    prefetch_epilogue,
    zeros,
)
from pipeline.kernels.registry import lowering


def registers(vw: int) -> int:
    """Vector registers of the target: 32 with AVX-512, else 16."""
    return 32 if vw >= 16 else 16


def tile_width(ow: int, k: int, vw: int) -> int:
    """Output columns per tile for K channel blocks: T*K accumulators, K weight
    vectors and one broadcast must fit the register file; tiles as even as possible."""
    widest = max(1, (registers(vw) - k - 1) // k)
    return -(-ow // -(-ow // widest))


def choose_k(span: int, oc_blocks: int, vw: int) -> int:
    """Channel blocks per tile for tiles over `span` outputs: the most accumulators
    in use, then the fewest loads per multiply-add (K weights + T broadcasts)."""
    best = None
    for k in (1, 2, 4):
        if oc_blocks % k:
            continue
        t = tile_width(span, k, vw)
        key = (t * k, -(t + k))
        if best is None or key > best[0]:
            best = (key, k)
    return best[1]


# How far ahead of the current weight vectors the kernel prefetches (bytes).
PREFETCH_BYTES = 4096


# Output planes of at most this many pixels are tiled as one static plan over all
# of them (tiles may span rows); larger ones row by row.
FLAT_MAX = 64


def tiling(oh: int, ow: int, oc_blocks: int, vw: int) -> tuple[int, int, bool]:
    """(K, T, flat) of a conv2d_nchwc with an oh x ow output and oc_blocks blocks."""
    flat = oh * ow <= FLAT_MAX
    span = oh * ow if flat else ow
    k = choose_k(span, oc_blocks, vw)
    return k, tile_width(span, k, vw), flat


def row_plan(ow_n: int, t: int, safe_lo: int, safe_hi: int) -> list[tuple]:
    """Split a row of ow_n outputs into tiles of width t (the last may be narrower).

    Returns ("static", start, width) for tiles generated one by one (they touch the
    padding or are the narrow last one) and ("loop", start, count) for runs of
    full tiles whose taps are all inside the input: one loop of `count` tiles.
    """
    plan: list[tuple] = []
    for start in range(0, ow_n, t):
        width = min(t, ow_n - start)
        inside = width == t and start >= safe_lo and start + width - 1 <= safe_hi
        if inside and plan and plan[-1][0] == "loop":
            plan[-1] = ("loop", plan[-1][1], plan[-1][2] + 1)
        elif inside:
            plan.append(("loop", start, 1))
        else:
            plan.append(("static", start, width))
    return plan


@dataclass(frozen=True)
class _Geo:
    """Everything static about one conv2d_nchwc kernel."""

    n: int
    icb: int
    h: int
    w: int
    ib: int
    ocg: int
    kh: int
    kw: int
    kob: int
    ob: int
    oh: int
    ow: int
    sh: int
    sw: int
    pt: int
    pl: int
    groups: int = 1  # conv groups: icb counts the input blocks of one group

    @property
    def k(self) -> int:
        return self.kob // self.ob

    def first_block(self, ocg):
        """The input's first channel block of the group of channel tile ocg."""
        return 0 if self.groups == 1 else ocg // (self.ocg // self.groups) * self.icb

    def x_offset(self, kb, plane, ih, iw):
        """Offset of x[n, icb, ih, iw, 0] given the offset of x[n, icb, 0, 0, 0]."""
        return plane + (ih * self.w + iw) * self.ib


def _lower(kb, node, ins, out, epilogue):
    x, w = ins[0], ins[1]
    n_n, _, h, wd, ib = x.type.shape
    ocg_n, icb_n, kh_n, kw_n, _, kob = w.type.shape
    _, ocb_n, oh_n, ow_n, ob = out.type.shape
    (sh, sw), (pt, pl, _, _) = node.attr("strides"), node.attr("pads")
    groups = node.attr("groups", 1)
    g = _Geo(n_n, icb_n, h, wd, ib, ocg_n, kh_n, kw_n, kob, ob, oh_n, ow_n, sh, sw, pt, pl,
             groups)
    bufs = (x, w, ins[2] if len(ins) > 2 else None, out, epilogue)
    work = out.type.size * (w.type.size // (ocg_n * kob))  # multiply-adds
    _, t, flat = tiling(oh_n, ow_n, ocb_n, ob)
    if flat:  # one static plan over the whole plane: every tap's validity is known here
        pixels = [(i // ow_n, i % ow_n) for i in range(oh_n * ow_n)]
        with parallel_for(kb, n_n * ocg_n, "groups", work=work) as item:
            n, ocg = item // ocg_n, item % ocg_n
            for start in range(0, len(pixels), t):
                _tile(kb, g, bufs, n, ocg, pixels[start:start + t], None)
        return
    # Row by row. Rows of one channel group in a row (weights stay in cache) unless
    # re-reading the weights for every row moves fewer bytes than re-reading the
    # input for every channel group.
    group_major = ocg_n * icb_n * h * wd * ib <= oh_n * w.type.size
    plan = row_plan(ow_n, t, -(-pl // sw), (wd - 1 + pl - (kw_n - 1)) // sw)
    bands = min(BANDS, oh_n)
    rpb = -(-oh_n // bands)
    per_band = ocg_n * rpb
    with parallel_for(kb, n_n * bands * per_band, "rows", work=work) as item:
        n, band, r = band_of(item, n_n, bands, per_band)
        inner = rpb if group_major else ocg_n
        major, minor = r // inner, r % inner
        ocg, r = (major, minor) if group_major else (minor, major)
        with band_row(kb, band, r, rpb, bands, oh_n) as oh:
            _row(kb, g, bufs, n, ocg, oh, plan, t)


def _row(kb, g: _Geo, bufs, n, ocg, oh, plan, t) -> None:
    """Output row oh of channel group ocg: its tiles as `plan` (row_plan) says."""
    ih0 = oh * g.sh - g.pt
    # the taps kh with 0 <= ih0 + kh < h
    row = (oh, ih0, kb.smax(-ih0, 0), kb.smin(g.h - ih0, g.kh))
    for entry in plan:
        if entry[0] == "static":
            _, start, width = entry
            _tile(kb, g, bufs, n, ocg, [(oh, start + j) for j in range(width)], row)
            continue
        _, start, count = entry
        with kb.loop(0, count, "tile") as j:
            ow0 = start + j * t
            _tile(kb, g, bufs, n, ocg, [(oh, ow0 + c) for c in range(t)], row)


def _tile(kb, g: _Geo, bufs, n, ocg, pixels, row):
    """One register tile: the output `pixels` [(oh, ow)] x K channel blocks.

    row is None when every pixel is static (taps are then all unrolled and the
    out-of-range ones left out), else (oh, ih0, kh_lo, kh_hi) of the tile's row:
    kh runs over [kh_lo, kh_hi) at run time, and an int ow lets the columns whose
    tap kw falls into the padding be left out.
    """
    x, w, bias, out, epilogue = bufs
    ocb0 = ocg * g.k
    accs = []
    for k in range(g.k):
        init = kb.vload(bias, (ocb0 + k) * g.ob, g.ob) if bias else zeros(g.ob)
        accs.append([kb.local(init) for _ in pixels])
        for oh, ow in pixels:
            prefetch_epilogue(kb, epilogue, out, [n, ocb0 + k, oh, ow, 0])
    with kb.loop(0, g.icb, "icb") as icb:
        plane = (n * (g.icb * g.groups) + g.first_block(ocg) + icb) * (g.h * g.w * g.ib)
        w_icb = (ocg * g.icb + icb) * (g.kh * g.kw * g.ib * g.kob)
        if row is None:
            _static_taps(kb, g, x, w, accs, pixels, plane, w_icb)
        else:
            _row_taps(kb, g, x, w, accs, pixels, plane, w_icb, row)
    for k in range(g.k):
        for j, (oh, ow) in enumerate(pixels):
            index = [n, ocb0 + k, oh, ow, 0]
            value = apply_epilogue(kb, epilogue, kb.get(accs[k][j]), index)
            kb.vstore(out, kb.dot(index[:4], out.strides[:4]), value)


def _static_taps(kb, g: _Geo, x, w, accs, pixels, plane, w_icb):
    """Every (kh, kw) tap unrolled, each with the pixels it does not put in the padding."""
    for kh in range(g.kh):
        for kw in range(g.kw):
            cols = [(j, g.x_offset(kb, plane, oh * g.sh - g.pt + kh, ow * g.sw - g.pl + kw))
                    for j, (oh, ow) in enumerate(pixels)
                    if 0 <= oh * g.sh - g.pt + kh < g.h and 0 <= ow * g.sw - g.pl + kw < g.w]
            _taps(kb, g, x, w, accs, w_icb + (kh * g.kw + kw) * g.ib * g.kob, cols)


def _row_taps(kb, g: _Geo, x, w, accs, pixels, plane, w_icb, row):
    """kh over the row's valid range at run time. Tiles inside the row (runtime ow)
    read, per kh, the KW*ib consecutive values (iw, ic) of every column's window
    against KW*ib consecutive weight rows: one loop. Border tiles (int ow) unroll kw,
    leaving out the columns whose tap falls into the padding."""
    _, ih0, kh_lo, kh_hi = row
    with kb.loop(kh_lo, kh_hi, "kh") as kh:
        ih = ih0 + kh
        w_kh = w_icb + kh * (g.kw * g.ib * g.kob)
        if not any(isinstance(ow, int) for _, ow in pixels):
            cols = [(j, g.x_offset(kb, plane, ih, ow * g.sw - g.pl))
                    for j, (_, ow) in enumerate(pixels)]
            _taps(kb, g, x, w, accs, w_kh, cols, g.kw * g.ib)
            return
        # kw outside ic: a broadcast input value then serves one tap only, so LLVM
        # keeps no values alive across taps (that would spill accumulators).
        for kw in range(g.kw):
            cols = [(j, g.x_offset(kb, plane, ih, ow * g.sw + (kw - g.pl)))
                    for j, (_, ow) in enumerate(pixels)
                    if 0 <= ow * g.sw - g.pl + kw < g.w]
            _taps(kb, g, x, w, accs, w_kh + kw * g.ib * g.kob, cols)


def _taps(kb, g: _Geo, x, w, accs, w_tap, cols, count=None):
    """One tap for every input channel of the block: per step r < count (default ib),
    K weight vectors at w_tap + r*kob and one broadcast x[x_off + r] per column
    (j, x_off) of `cols`."""
    if not cols:
        return
    with kb.loop(0, count or g.ib, "ic") as ic:
        w_ic = w_tap + ic * g.kob
        wv = [kb.vload(w, w_ic + k * g.ob, g.ob) for k in range(g.k)]
        # The weights stream through once per tile, 128-256 bytes per step: the
        # hardware prefetchers fall behind when they come from L3 or memory.
        for k in range(g.k):
            prefetch(kb, w, w_ic + (PREFETCH_BYTES // 4 + k * g.ob))
        for j, x_off in cols:
            xv = kb.splat(kb.load(x, x_off + ic), g.ob)
            for k, wk in enumerate(wv):
                kb.set(accs[k][j], fma(kb, xv, wk, kb.get(accs[k][j])))


lowering("conv2d_nchwc", lower=_lower)


def pack_weight(weight, ib: int, ob: int, k: int):
    """OIHW weights -> [OC/(k*ob), C/ib, KH, KW, ib, k*ob] (the layout _lower reads)."""
    oc, c, kh, kw = weight.shape
    g = weight.reshape(oc // (k * ob), k * ob, c // ib, ib, kh, kw)
    return g.transpose(0, 2, 4, 5, 3, 1).copy()
