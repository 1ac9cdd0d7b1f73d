"""The operator cases of tests/ops/test_ops_shape.py: CASES maps a name to a function
returning (model, feeds). tests/cross/test_cpu_sweep.py compiles them for every CPU."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tests.support.onnx_models import rand
from tests.support.op_cases.elementwise import ints, model_of

node = helper.make_node
X = rand(2, 3, 4, 5)


def op(op_type, x=X, inits=None, extra=(), opset=13, n_out=1, **attrs):
    """One `op_type` node on input x (+ constant inputs `extra` from `inits`)."""
    outputs = ["y"] if n_out == 1 else [f"y{k}" for k in range(n_out)]
    nodes = [node(op_type, ["x", *extra], outputs, **attrs)]
    return model_of(nodes, {"x": x}, x.dtype, opset, inits or {}, outputs), {"x": x}


def i64(*values):
    return np.array(values, np.int64)


def with_inputs(op_type, x=X, opset=13, **consts):
    """`op_type` whose inputs after x are the constants given by keyword (None: empty)."""
    inits = {k: v for k, v in consts.items() if v is not None}
    extra = [k if v is not None else "" for k, v in consts.items()]
    return op(op_type, x, inits, extra, opset)


def slice10(starts, ends, axes=None, steps=None, x=X):
    return with_inputs("Slice", x, starts=i64(*starts), ends=i64(*ends),
                       axes=None if axes is None else i64(*axes),
                       steps=None if steps is None else i64(*steps))


def gather(indices, axis=0, x=X):
    return model_of([node("Gather", ["x", "i"], ["y"], axis=axis)], f := {"x": x, "i": indices},
                    x.dtype), f


def resize(x, scales=None, sizes=None, opset=13, roi=(), **attrs):
    inits = {"roi": np.array(roi, np.float32)}
    inits["scales"] = np.array(scales, np.float32) if scales else np.zeros(0, np.float32)
    if sizes:
        inits["sizes"] = i64(*sizes)
    extra = ["roi", "scales"] + (["sizes"] if sizes else [])
    return op("Resize", x, inits, extra, opset, **attrs)


def shape_chain():
    """Reshape x [2,3,4,5] to [shape[0], shape[1], -1], the target built from Shape."""
    nodes = [node("Shape", ["x"], ["s"]),
             node("Gather", ["s", "i0"], ["d0"], axis=0),
             node("Gather", ["s", "i1"], ["d1"], axis=0),
             node("Unsqueeze", ["d0", "ax"], ["u0"]), node("Unsqueeze", ["d1", "ax"], ["u1"]),
             node("Concat", ["u0", "u1", "m1"], ["target"], axis=0),
             node("Reshape", ["x", "target"], ["r"]), node("Relu", ["r"], ["y"])]
    inits = {"i0": np.array(0, np.int64), "i1": np.array(1, np.int64), "ax": i64(0),
             "m1": i64(-1)}
    return model_of(nodes, {"x": X}, inits=inits, out_shape=(2, 3, 20)), {"x": X}


def float_shape_chain():
    """Upsample-by-2 sizes computed the way PyTorch exports do: Shape -> Slice ->
    Cast -> Mul -> Cast -> Concat -> Resize(sizes)."""
    x = rand(1, 2, 3, 4)
    nodes = [node("Shape", ["x"], ["s"]),
             node("Slice", ["s", "st", "en"], ["hw"]),
             node("Cast", ["hw"], ["hwf"], to=TensorProto.FLOAT),
             node("Mul", ["hwf", "two"], ["hw2f"]),
             node("Cast", ["hw2f"], ["hw2"], to=TensorProto.INT64),
             node("Slice", ["s", "z", "st"], ["nc"]),
             node("Concat", ["nc", "hw2"], ["sizes"], axis=0),
             node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest")]
    inits = {"st": i64(2), "en": i64(4), "z": i64(0), "two": np.array(2.0, np.float32)}
    return model_of(nodes, {"x": x}, inits=inits, out_shape=(1, 2, 6, 8)), {"x": x}


def constant_of_shape_range():
    nodes = [node("Shape", ["x"], ["s"]),
             node("ConstantOfShape", ["s"], ["ones"],
                  value=numpy_helper.from_array(np.ones(1, np.float32))),
             node("Range", ["r0", "r1", "r2"], ["r"]),
             node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
             node("Mul", ["ones", "rf"], ["m"]), node("Add", ["x", "m"], ["y"])]
    inits = {"r0": np.array(1, np.int64), "r1": np.array(11, np.int64),
             "r2": np.array(2, np.int64)}
    return model_of(nodes, {"x": X}, inits=inits), {"x": X}


CASES = {
    # -- Transpose
    "transpose_default": lambda: op("Transpose"),
    "transpose_0231": lambda: op("Transpose", perm=[0, 2, 3, 1]),
    "transpose_int64": lambda: op("Transpose", ints(3, 4, 2), perm=[2, 0, 1]),
    "transpose_then_add_relu": lambda: (model_of(
        [node("Transpose", ["x"], ["t"], perm=[1, 0]), node("Add", ["t", "b"], ["a"]),
         node("Relu", ["a"], ["y"])], f := {"x": rand(5, 7)}, inits={"b": rand(7, 1)}), f),
    # -- Squeeze / Unsqueeze
    "squeeze13_axes": lambda: with_inputs("Squeeze", rand(2, 1, 3, 1), axes=i64(1, -1)),
    "squeeze13_all": lambda: op("Squeeze", rand(1, 3, 1, 4)),
    "squeeze11_attr": lambda: op("Squeeze", rand(2, 1, 3), opset=11, axes=[1]),
    "unsqueeze13": lambda: with_inputs("Unsqueeze", rand(2, 3), axes=i64(0, 3)),
    "unsqueeze13_neg": lambda: with_inputs("Unsqueeze", rand(2, 3), axes=i64(-1)),
    "unsqueeze11_attr": lambda: op("Unsqueeze", rand(2, 3), opset=11, axes=[1]),
    # -- Slice
    "slice_basic": lambda: slice10([0, 1], [2, 3], [1, 2]),
    "slice_neg_start_clamped_end": lambda: slice10([-2], [1 << 62], [3]),
    "slice_steps": lambda: slice10([0, 1], [4, 5], [2, 3], [2, 2]),
    "slice_negative_step": lambda: slice10([-1], [-(1 << 62)], [3], [-1]),
    "slice_negative_step2": lambda: slice10([3, 4], [0, -6], [2, 3], [-2, -3]),
    "slice_no_axes": lambda: slice10([1, 0], [2, 2]),
    "slice_empty": lambda: slice10([3], [1], [2]),
    "slice_int64": lambda: slice10([1], [3], [0], x=ints(4, 3)),
    "slice1_attrs": lambda: op("Slice", opset=1, starts=[1], ends=[3], axes=[2]),
    # -- Split
    "split13_sizes": lambda: (model_of([node("Split", ["x", "s"], ["y0", "y1"], axis=2)],
                                       {"x": X}, inits={"s": i64(1, 3)},
                                       outputs=("y0", "y1")), {"x": X}),
    "split13_equal": lambda: op("Split", n_out=3, axis=1),
    "split11_attr": lambda: op("Split", opset=11, n_out=2, axis=-1, split=[2, 3]),
    "split18_num_outputs": lambda: op("Split", opset=18, n_out=3, axis=3, num_outputs=3),
    # -- Gather
    "gather_axis0_int64": lambda: gather(i64(1, 0, 1)),
    "gather_axis2_neg": lambda: gather(i64(-1, 0, 2, -4), axis=2),
    "gather_2d_indices_int32": lambda: gather(np.array([[0, 3], [4, -2]], np.int32), axis=3),
    "gather_scalar_index": lambda: gather(np.array(-1, np.int64), axis=1),
    "gather_int64_data": lambda: gather(i64(2, 0), x=ints(3, 4)),
    "gather_embedding_const_data": lambda: (model_of(
        [node("Gather", ["table", "x"], ["y"])], f := {"x": ints(2, 3, low=-5, high=5)},
        inits={"table": rand(5, 4)}), f),
    "gather_const_indices": lambda: op("Gather", inits={"i": i64(0, 2)}, extra=["i"], axis=1),
    # -- Pad
    "pad_constant": lambda: with_inputs("Pad", pads=i64(0, 1, 2, 0, 0, 0, 1, 3),
                                        value=np.array(1.5, np.float32)),
    "pad_constant_default_value": lambda: with_inputs("Pad", pads=i64(0, 0, 1, 1, 0, 0, 1, 1)),
    "pad_negative_crop": lambda: with_inputs("Pad", pads=i64(0, 0, -1, 2, 0, 0, 1, -2)),
    "pad_reflect": lambda: op("Pad", inits={"p": i64(0, 0, 2, 3, 0, 0, 3, 2)}, extra=["p"],
                              mode="reflect"),
    "pad_edge": lambda: op("Pad", inits={"p": i64(0, 1, 2, 3, 1, 0, 3, 4)}, extra=["p"],
                           mode="edge"),
    "pad_int64_constant": lambda: with_inputs("Pad", ints(3, 4), pads=i64(1, 0, 0, 2),
                                              value=np.array(7, np.int64)),
    "pad2_attrs": lambda: op("Pad", opset=2, pads=[0, 0, 1, 1, 0, 0, 1, 1], value=2.0),
    "pad18_axes": lambda: with_inputs("Pad", opset=18, pads=i64(1, 2), value=None,
                                      axes=i64(-1)),
    # -- Expand / Tile
    "expand_grow": lambda: with_inputs("Expand", rand(3, 1), shape=i64(2, 3, 4)),
    "expand_bidirectional": lambda: with_inputs("Expand", rand(3, 4), shape=i64(2, 1, 1)),
    "expand_bool": lambda: with_inputs("Expand", np.array([[True], [False]]),
                                       shape=i64(2, 3)),
    "tile": lambda: with_inputs("Tile", rand(2, 3), repeats=i64(2, 3)),
    "tile_int64": lambda: with_inputs("Tile", ints(2, 1, 3), repeats=i64(1, 4, 2)),
    # -- DepthToSpace / SpaceToDepth
    "depth_to_space_dcr": lambda: op("DepthToSpace", rand(2, 8, 3, 4), blocksize=2),
    "depth_to_space_crd": lambda: op("DepthToSpace", rand(1, 18, 2, 3), blocksize=3,
                                     mode="CRD"),
    "space_to_depth": lambda: op("SpaceToDepth", rand(2, 3, 4, 6), blocksize=2),
    # -- Resize / Upsample, nearest
    "resize_nearest_up_asym_floor": lambda: resize(
        rand(1, 2, 3, 4), [1, 1, 2, 3], mode="nearest",
        coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    "resize_nearest_half_pixel_round_floor": lambda: resize(
        rand(1, 2, 4, 5), [1, 1, 1.5, 0.6], mode="nearest"),
    "resize_nearest_round_prefer_ceil_sizes": lambda: resize(
        rand(1, 2, 4, 5), sizes=[1, 2, 7, 3], mode="nearest",
        nearest_mode="round_prefer_ceil"),
    "resize_nearest_align_ceil": lambda: resize(
        rand(1, 1, 5, 5), [1, 1, 0.5, 1.7], mode="nearest",
        coordinate_transformation_mode="align_corners", nearest_mode="ceil"),
    "resize_nearest_tf_half_pixel": lambda: resize(
        rand(1, 1, 4, 4), [1, 1, 2, 2], mode="nearest",
        coordinate_transformation_mode="tf_half_pixel_for_nn"),
    "resize10_nearest_up": lambda: with_inputs("Resize", rand(1, 2, 3, 3), opset=10,
                                               scales=np.array([1, 1, 2, 2], np.float32)),
    "resize10_nearest_down": lambda: with_inputs("Resize", rand(1, 2, 6, 6), opset=10,
                                                 scales=np.array([1, 1, 0.5, 0.7],
                                                                 np.float32)),
    "upsample9_nearest": lambda: with_inputs("Upsample", rand(1, 2, 3, 3), opset=9,
                                             scales=np.array([1, 1, 2, 3], np.float32)),
    "upsample7_linear": lambda: op("Upsample", rand(1, 2, 3, 3), opset=7, mode="linear",
                                   scales=[1.0, 1.0, 2.0, 2.0]),
    # -- Resize, linear
    "resize_linear_half_pixel_up": lambda: resize(rand(1, 2, 3, 4), [1, 1, 2, 1.5],
                                                  mode="linear"),
    "resize_linear_half_pixel_down": lambda: resize(rand(1, 2, 6, 7), [1, 1, 0.5, 0.6],
                                                    mode="linear"),
    "resize_linear_align_corners": lambda: resize(
        rand(1, 2, 3, 4), sizes=[1, 2, 5, 7], mode="linear",
        coordinate_transformation_mode="align_corners"),
    "resize_linear_asymmetric": lambda: resize(
        rand(1, 2, 3, 4), [1, 1, 2, 2], mode="linear",
        coordinate_transformation_mode="asymmetric"),
    "resize_linear_pytorch_half_pixel": lambda: resize(
        rand(1, 2, 4, 4), sizes=[1, 2, 1, 6], mode="linear",
        coordinate_transformation_mode="pytorch_half_pixel"),
    "resize18_not_larger_axes": lambda: resize(
        rand(1, 2, 4, 6), sizes=[5, 5], opset=18, mode="linear", axes=[2, 3],
        keep_aspect_ratio_policy="not_larger"),
    "resize18_not_smaller": lambda: resize(
        rand(1, 2, 4, 6), sizes=[1, 2, 5, 5], opset=18, mode="nearest",
        keep_aspect_ratio_policy="not_smaller"),
    "space_to_depth_int64": lambda: op("SpaceToDepth", ints(1, 2, 4, 2), blocksize=2),
    "resize_cubic_up": lambda: resize(rand(1, 2, 4, 4), [1, 1, 2, 1.5], mode="cubic"),
    "resize_cubic_down_align_corners": lambda: resize(
        rand(1, 2, 6, 7), [1, 1, 0.5, 0.8], mode="cubic",
        coordinate_transformation_mode="align_corners"),
    "resize_cubic_exclude_outside_a05": lambda: resize(
        rand(1, 1, 5, 4), sizes=[1, 1, 8, 9], mode="cubic", cubic_coeff_a=-0.5,
        exclude_outside=1),
    "resize_cubic_asymmetric_2d": lambda: resize(
        rand(5, 6), [1.5, 0.7], mode="cubic", coordinate_transformation_mode="asymmetric"),
    "resize_linear_2d": lambda: resize(rand(3, 4), [2, 1.5], mode="linear"),
    "resize_cubic_antialias_exclude_outside": lambda: resize(
        rand(1, 2, 7, 9), [1, 1, 0.4, 1.3], opset=18, mode="cubic", antialias=1,
        exclude_outside=1, cubic_coeff_a=-0.5),
    "resize_nearest_tf_crop_scales_extrapolate": lambda: resize(
        rand(1, 1, 5, 6), [1, 1, 1.5, 0.5], roi=[0, 0, 0.2, -0.3, 1, 1, 0.9, 0.8],
        mode="nearest", coordinate_transformation_mode="tf_crop_and_resize",
        extrapolation_value=-3.0),
    "resize_linear_relu_fused": lambda: (model_of(
        [node("Resize", ["x", "", "s"], ["r"], mode="linear"), node("Relu", ["r"], ["y"])],
        f := {"x": rand(1, 2, 3, 3)}, inits={"s": np.array([1, 1, 2, 2], np.float32)}), f),
    # -- build-time shape arithmetic
    "shape_chain_reshape": shape_chain,
    "float_shape_chain_resize": float_shape_chain,
    "constant_of_shape_range": constant_of_shape_range,
    "shape15_start_end": lambda: shape_start_end(),
    "shape_is_the_output": lambda: (model_of([node("Shape", ["x"], ["y"])], {"x": X}, np.int64),
                                    {"x": X}),
    "eyelike_windows": lambda: eyelike_windows(),
}


def eyelike_windows():
    """x + EyeLike(x, k=-1) + the three windows of size 5 (Hamming symmetric)."""
    x = rand(3, 5)
    nodes = [node("EyeLike", ["x"], ["e"], k=-1), node("Add", ["x", "e"], ["s0"]),
             node("HannWindow", ["n"], ["w0"]),
             node("HammingWindow", ["n"], ["w1"], periodic=0),
             node("BlackmanWindow", ["n"], ["w2"], output_datatype=TensorProto.DOUBLE),
             node("Cast", ["w2"], ["w2f"], to=TensorProto.FLOAT),
             node("Sum", ["s0", "w0", "w1", "w2f"], ["y"])]
    return model_of(nodes, {"x": x}, opset=17, inits={"n": np.array(5, np.int64)}), {"x": x}



def shape_start_end():
    nodes = [node("Shape", ["x"], ["s"], start=1, end=-1),
             node("Concat", ["m", "s"], ["s2"], axis=0), node("Reshape", ["x", "s2"], ["y"])]
    return model_of(nodes, {"x": X}, opset=15, inits={"m": i64(-1)}, out_shape=(10, 3, 4)), \
        {"x": X}

# compared with onnx.reference instead: kernels onnxruntime lacks, and align_corners from
# a scale giving a fractional in_len * scale (onnxruntime divides by out_len - 1, the
# ONNX reference by in_len * scale - 1: pipeline/frontend/onnx/resize.py)
NOT_IN_ONNXRUNTIME = {"space_to_depth_int64", "eyelike_windows", "resize_nearest_align_ceil",
                      "resize_cubic_down_align_corners", "resize_cubic_antialias_exclude_outside",
                      "resize_nearest_tf_crop_scales_extrapolate"}
