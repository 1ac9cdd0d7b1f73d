"""Winograd F(m x m, 3 x 3) convolution (ops/conv_winograd.py) and AlterOpLayout's
choice of it, compared with onnx.reference at opt_level 3."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.frontend import from_onnx
from pipeline.kernels import conv_winograd
from tests.support.fast_kernels import (
    AVX512,
    HASWELL,
    NATIVE,
    RELU,
    check_winograd,
    conv_net,
    host_has_avx512,
)


@pytest.mark.parametrize("m", [2, 4])
def test_transforms_compute_a_2d_correlation(m):
    """Aᵀ [U ⊙ (Bᵀ d B)] A with U from pack_weight is the 3x3 correlation of an
    (m+2)² patch, for every (output, input channel) pair of the packed layout."""
    rng = np.random.default_rng(0)
    bt, _, at = conv_winograd.MATRICES[m]
    a, oc, c, ob, k = m + 2, 8, 3, 4, 2
    w = rng.standard_normal((oc, c, 3, 3)).astype(np.float32)
    d = rng.standard_normal((a, a))
    u = conv_winograd.pack_weight(w, m, ob, k)          # [P, OC/(k*ob), C, k*ob]
    assert u.shape == (a * a, oc // (k * ob), c, k * ob)
    for o in range(oc):
        for ci in range(c):
            ug = u[:, o // (k * ob), ci, o % (k * ob)].reshape(a, a).astype(np.float64)
            y = at @ (ug * (bt @ d @ bt.T)) @ at.T
            want = np.array([[np.sum(d[i:i + 3, j:j + 3] * w[o, ci]) for j in range(m)]
                             for i in range(m)])
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def _case(target, **case):
    """A (target, conv_net arguments) parameter; AVX-512 cases skip without it."""
    name = "-".join(f"{k}{v}" for k, v in case.items() if k != "after")
    marks = pytest.mark.skipif(target == AVX512 and not host_has_avx512(),
                               reason="host has no AVX-512")
    return pytest.param(target, case, id=f"{name}-{target.split('=')[-1]}", marks=marks)


@pytest.mark.parametrize("target,case", [
    _case(AVX512, c=16, oc=32, hw=17, after=[RELU]),                     # partial border tiles
    _case(AVX512, c=32, oc=16, hw=13, pads=[0, 1, 2, 0], bias=False),    # asymmetric pads
    _case(AVX512, c=16, oc=16, hw=10, pads=[0, 0, 0, 0]),                # no padding
    _case(AVX512, c=32, oc=32, hw=14, residual=True, after=[RELU]),      # residual epilogue
    _case(AVX512, c=16, oc=32, hw=9, hw2=23, batch=2),                   # batch 2, rectangle
    _case(HASWELL, c=16, oc=24, hw=11, after=[RELU]),                    # 8 lanes
])
def test_winograd_conv_matches_onnx_reference(target, case):
    check_winograd(*conv_net(**case), target)


def test_f2x2_tiles_match_onnx_reference(monkeypatch):
    """F(2x2, 3x3), the smaller tile, through the same kernel."""
    monkeypatch.setattr(conv_winograd, "TILE", 2)
    check_winograd(*conv_net(c=16, oc=16, hw=11, after=[RELU]), NATIVE)


def test_disabled_by_option_and_skipped_where_direct_is_faster():
    """AlterOpLayout.winograd: false keeps the direct blocked conv; the rule keeps it
    for a 7x7 plane of 512 channels (9 MiB of transformed weights per tile) and for
    stride 2, and takes Winograd for ResNet's 56x56 64-channel layer."""
    check_winograd(*conv_net(c=16, oc=32, hw=17), NATIVE, uses_winograd=False,
           config={"AlterOpLayout.winograd": False})

    def chosen(c, oc, hw, stride=1):
        graph, params = from_onnx(conv_net(c=c, oc=oc, hw=hw, stride=stride)[0])
        conv = next(n for n in graph.nodes if n.op == "conv2d")
        oh, ow = graph.types[conv.outputs[0]].shape[2:]
        return conv_winograd.worth_it(conv, params[conv.inputs[1]], oh, ow, 16)

    assert chosen(64, 64, 56) and chosen(256, 256, 14)
    assert not chosen(512, 512, 7) and not chosen(64, 64, 56, stride=2)
