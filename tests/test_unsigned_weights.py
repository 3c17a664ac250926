"""The uint8-weight rewrite of a QDQ graph: the same model, computed exactly on every CPU.

A toy QDQ matmul (uint8 activations, int8 weights) is built with values that make u8 x s8
pair sums overflow 16 bits, the case where AVX2's ``vpmaddubsw`` saturates. Rewritten, its
weights are uint8, dequantise to the same floats, and ONNX Runtime's fused result equals
the exact integer product computed by numpy (on any CPU: the u8 x u8 kernels never
saturate). Then the real smart-turn graph the model store makes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort  # type: ignore[import-untyped]
import pytest
from onnx import TensorProto, helper, numpy_helper

from model_runtime.unsigned_weights import int8_weights_to_uint8, unsigned_weights
from testkit.models import model_file as _model_file

X_SCALE, W_SCALE = np.float32(0.05), np.float32(0.01)


def _toy(w_q: np.ndarray, *, zero_point: bool = True) -> onnx.ModelProto:
    """y = DQ(Q(x)) @ DQ(w_q): ORT fuses it into an integer matmul."""
    inits = [
        numpy_helper.from_array(w_q, "w_q"),
        numpy_helper.from_array(np.array(W_SCALE), "w_scale"),
        numpy_helper.from_array(np.array(X_SCALE), "x_scale"),
        numpy_helper.from_array(np.array(0, np.uint8), "x_zero"),
    ]
    w_inputs = ["w_q", "w_scale"]
    if zero_point:
        inits.append(numpy_helper.from_array(np.array(0, np.int8), "w_zero"))
        w_inputs.append("w_zero")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"], name="q_x"),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zero"], ["xd"], name="dq_x"),
        helper.make_node("DequantizeLinear", w_inputs, ["w"], name="dq_w"),
        helper.make_node("MatMul", ["xd", "w"], ["y"], name="mm"),
    ]
    graph = helper.make_graph(
        nodes,
        "toy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _weights() -> np.ndarray:
    rng = np.random.default_rng(3)
    w = rng.integers(100, 128, size=(64, 8)).astype(np.int8)  # large, mostly one sign
    w[::7] = -w[::7]
    return w


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    s = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return np.asarray(s.run(None, {"x": x})[0])


def test_rewritten_graph_computes_the_exact_integer_product(tmp_path: Path) -> None:
    w_q = _weights()
    src, dst = tmp_path / "toy.onnx", tmp_path / "toy-u8.onnx"
    onnx.save(_toy(w_q), str(src))
    int8_weights_to_uint8(src, dst)
    model = onnx.load(str(dst))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert inits["w_q"].dtype == np.uint8 and inits["w_zero"].dtype == np.uint8
    assert int(inits["w_zero"]) == 128
    # the weights dequantise to exactly the same floats
    before = (w_q.astype(np.float32) - 0) * W_SCALE
    after = (inits["w_q"].astype(np.float32) - 128) * W_SCALE
    np.testing.assert_array_equal(before, after)
    # activations near the top of uint8: u8 x s8 pair sums reach ~2 x 250 x 127 > 32767
    x = np.full((2, 64), 12.5, np.float32)
    x[1, ::2] = 11.0
    xq = np.clip(np.round(x / X_SCALE), 0, 255).astype(np.int64)
    exact = (xq @ w_q.astype(np.int64)).astype(np.float64) * float(X_SCALE) * float(W_SCALE)
    np.testing.assert_allclose(_run(model, x), exact, rtol=1e-5)


def test_rewrite_refuses_what_it_would_change() -> None:
    shared = _toy(_weights())
    # the int8 weights also feed another node: shifting them would change its input
    shared.graph.node.append(helper.make_node("Cast", ["w_q"], ["w_cast"], to=TensorProto.FLOAT))
    with pytest.raises(ValueError, match="used outside DequantizeLinear"):
        unsigned_weights(shared)
    with pytest.raises(ValueError, match="need a zero point"):
        unsigned_weights(_toy(_weights(), zero_point=False))


def test_nothing_to_rewrite_is_an_error(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "plain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    onnx.save(helper.make_model(graph, ir_version=8), str(tmp_path / "plain.onnx"))
    with pytest.raises(ValueError, match="no int8 weights"):
        int8_weights_to_uint8(tmp_path / "plain.onnx", tmp_path / "out.onnx")


def test_store_makes_smart_turns_unsigned_twin() -> None:
    shipped = onnx.load(str(_model_file("smart-turn-v3.2", "smart-turn-v3.2-cpu.onnx")))
    twin = onnx.load(str(_model_file("smart-turn-v3.2", "smart-turn-v3.2-cpu-u8.onnx")))
    types = {t.data_type for t in twin.graph.initializer}
    assert TensorProto.INT8 not in types and TensorProto.UINT8 in types
    # nothing but the weights' storage changed: same nodes, same dequantised weights
    assert [n.op_type for n in shipped.graph.node] == [n.op_type for n in twin.graph.node]
    mine = {t.name: numpy_helper.to_array(t) for t in twin.graph.initializer}
    for t in shipped.graph.initializer:
        a = numpy_helper.to_array(t)
        if t.data_type == TensorProto.INT8:  # weights and their zero points, shifted alike
            np.testing.assert_array_equal(a.astype(np.int16) + 128, mine[t.name])
        else:
            np.testing.assert_array_equal(a, mine[t.name])
