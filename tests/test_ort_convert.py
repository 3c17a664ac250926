"""The .ort -> ONNX converter: a faithful, deterministic, checked rebuild.

A small model shaped like Moonshine's decoder (int8 weights dequantised by Cast/Mul/Add,
an If whose branches read outer-scope weights, symbolic dims, many attribute kinds) is
saved in ORT format by onnxruntime itself, converted back, and must compute bit-identical
outputs. Then the real Moonshine encoder: checker, determinism, same numbers as the .ort.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort  # type: ignore[import-untyped]
import pytest
from onnx import TensorProto, helper, numpy_helper

from model_runtime.ort_convert import _topological, ort_to_onnx
from testkit.models import model_file as _model_file


def _session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _toy_onnx() -> onnx.ModelProto:
    """x[N,4] -> If(flag): x @ W (then) or transpose-concat-leakyrelu of x (else), + bias."""
    rng = np.random.default_rng(7)
    w_q = rng.integers(-128, 127, size=(4, 4), dtype=np.int8)
    inits = [
        numpy_helper.from_array(w_q, "w_q"),
        numpy_helper.from_array(np.array(0.02, np.float32), "w_scale"),
        numpy_helper.from_array(np.array(-0.5, np.float32), "w_zero"),
        numpy_helper.from_array(np.arange(4, dtype=np.float32), "bias"),
    ]
    main = [
        helper.make_node("Cast", ["w_q"], ["w_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["w_f", "w_scale"], ["w_m"]),
        helper.make_node("Add", ["w_m", "w_zero"], ["w"]),
    ]
    then_g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["t_out"], name="then_mm")],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, ["N", 4])],
    )
    else_g = helper.make_graph(
        [
            helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
            helper.make_node("Transpose", ["xt"], ["xtt"], perm=[1, 0]),
            helper.make_node("LeakyRelu", ["xtt"], ["e_out"], alpha=0.25),
        ],
        "else",
        [],
        [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, ["N", 4])],
    )
    main += [
        helper.make_node("If", ["flag"], ["y0"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Add", ["y0", "bias"], ["y"]),
        helper.make_node("ReduceMean", ["y"], ["m"], axes=[1], keepdims=1),
    ]
    graph = helper.make_graph(
        main,
        "toy",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, [1]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("m", TensorProto.FLOAT, ["N", 1]),
        ],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def toy_ort(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the toy as .onnx, the same toy saved by onnxruntime in ORT format)."""
    d = tmp_path_factory.mktemp("toy")
    src = d / "toy.onnx"
    onnx.save(_toy_onnx(), str(src))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.optimized_model_filepath = str(d / "toy.ort")
    opts.add_session_config_entry("session.save_model_format", "ORT")
    ort.InferenceSession(str(src), opts, providers=["CPUExecutionProvider"])
    assert (d / "toy.ort").read_bytes()[4:8] == b"ORTM"
    return src, d / "toy.ort"


def _run(path: Path, x: np.ndarray, flag: bool) -> list[np.ndarray]:
    return list(_session(path).run(None, {"x": x, "flag": np.array([flag])}))


@pytest.mark.parametrize("fold", [True, False])
def test_toy_round_trip_computes_the_same(
    toy_ort: tuple[Path, Path], tmp_path: Path, fold: bool
) -> None:
    src, ort_file = toy_ort
    dst = tmp_path / "toy.onnx"
    ort_to_onnx(ort_file, dst, fold_constants=fold)
    model = onnx.load(str(dst))
    onnx.checker.check_model(model, full_check=True)
    # the If survived with both branches, the attributes with their values
    (if_node,) = [n for n in model.graph.node if n.op_type == "If"]
    branches = {a.name: a.g for a in if_node.attribute}
    assert [n.op_type for n in branches["then_branch"].node] == ["MatMul"]
    else_nodes = branches["else_branch"].node
    assert [n.op_type for n in else_nodes] == ["Transpose", "Transpose", "LeakyRelu"]
    assert helper.get_attribute_value(else_nodes[2].attribute[0]) == pytest.approx(0.25)
    assert list(helper.get_attribute_value(else_nodes[0].attribute[0])) == [1, 0]
    # symbolic dims are kept on the graph's inputs and outputs
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    assert [o.name for o in model.graph.output] == ["y", "m"]
    # folding removes the per-run dequantisation; without it the int8 weight stays
    init_types = {t.name: t.data_type for t in model.graph.initializer}
    ops = [n.op_type for n in model.graph.node]
    if fold:
        assert "Cast" not in ops and "Mul" not in ops
        assert init_types["w"] == TensorProto.FLOAT and "w_q" not in init_types
    else:
        assert ops[:3] == ["Cast", "Mul", "Add"] and init_types["w_q"] == TensorProto.INT8
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    for flag in (True, False):
        want, got = _run(src, x, flag), _run(dst, x, flag)
        for a, b in zip(want, got, strict=True):
            np.testing.assert_array_equal(a, b)


def test_not_an_ort_model_is_a_clear_error(tmp_path: Path, toy_ort: tuple[Path, Path]) -> None:
    garbage = tmp_path / "garbage.ort"
    garbage.write_bytes(os.urandom(4096))
    dst = tmp_path / "out.onnx"
    with pytest.raises(ValueError, match=r"garbage\.ort.*not an ORT-format model"):
        ort_to_onnx(garbage, dst)
    with pytest.raises(ValueError, match=r"toy\.onnx.*not an ORT-format model"):
        ort_to_onnx(toy_ort[0], dst)  # a plain ONNX file is not one either
    truncated = tmp_path / "truncated.ort"
    truncated.write_bytes(toy_ort[1].read_bytes()[:64])
    with pytest.raises(ValueError, match=r"truncated\.ort"):
        ort_to_onnx(truncated, dst)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["garbage.ort", "truncated.ort"]


def test_write_is_atomic_and_replaces(tmp_path: Path, toy_ort: tuple[Path, Path]) -> None:
    dst = tmp_path / "toy.onnx"
    dst.write_bytes(b"old")
    ort_to_onnx(toy_ort[1], dst)
    assert dst.read_bytes()[:1] != b"o" and onnx.load(str(dst)).graph.name == "main_graph"
    assert [p.name for p in tmp_path.iterdir()] == ["toy.onnx"]  # no temp file left
    assert dst.stat().st_mode & 0o777 == 0o644


def test_moonshine_encoder_checked_deterministic_and_same_numbers(tmp_path: Path) -> None:
    src = _model_file("moonshine-base-en-ort", "encoder_model.ort")
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    ort_to_onnx(src, a)
    ort_to_onnx(src, b)
    assert a.read_bytes() == b.read_bytes()
    model = onnx.load(str(a))
    onnx.checker.check_model(model)
    assert not [t for t in model.graph.initializer if t.data_type == TensorProto.INT8]
    # 1 s of a chirp through both: the rebuilt graph computes what the shipped one does
    t = np.arange(16000, dtype=np.float32) / 16000
    x = (0.3 * np.sin(2 * np.pi * (200 + 800 * t) * t)).astype(np.float32)[None, :]
    want = _session(src).run(None, {"input_values": x})[0]
    got = _session(a).run(None, {"input_values": x})[0]
    assert want.shape == got.shape == (1, 40, 416)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def test_moonshine_decoder_keeps_the_cache_branch(tmp_path: Path) -> None:
    dst = tmp_path / "decoder.onnx"
    ort_to_onnx(_model_file("moonshine-base-en-ort", "decoder_model_merged.ort"), dst)
    model = onnx.load(str(dst), load_external_data=False)
    (if_node,) = [n for n in model.graph.node if n.op_type == "If"]
    assert list(if_node.input) == ["use_cache_branch"]
    assert {a.name for a in if_node.attribute} == {"then_branch", "else_branch"}
    assert {o.domain for o in model.opset_import} == {""}
    names = [i.name for i in model.graph.input]
    assert names[:2] == ["input_ids", "encoder_hidden_states"] and len(names) == 35
    dims = model.graph.input[2].type.tensor_type.shape.dim
    assert [d.dim_value or d.dim_param for d in dims] == [
        "batch_size",
        8,
        "past_decoder_sequence_length",
        52,
    ]


def test_nodes_are_put_in_data_flow_order() -> None:
    """ORT's node indices need not be topological (optimisers append nodes); ONNX's must be."""
    a = helper.make_node("Relu", ["x"], ["a"], name="a")
    b = helper.make_node("Neg", ["a"], ["b"], name="b")
    c = helper.make_node("If", ["flag"], ["c"], name="c")  # reads "b" inside a branch
    d = helper.make_node("Abs", ["x"], ["d"], name="d")
    order = _topological([(0, c, ["b"]), (1, b, []), (2, d, []), (3, a, [])], Path("m.ort"))
    assert [n.name for n in order] == ["d", "a", "b", "c"]
    with pytest.raises(ValueError, match=r"m\.ort.*cycle"):
        loop = helper.make_node("Neg", ["b"], ["a"], name="loop")
        _topological([(0, loop, []), (1, b, [])], Path("m.ort"))
