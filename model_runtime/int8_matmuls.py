"""Moonshine's decoder with 8-bit matrix weights: about half the CPU per token.

Why: a decoder step turns one token into the next by reading every one of the decoder's
41 M float weights (166 MB), so on a CPU it is bound by memory, not arithmetic (9-12 ms a
step on the 2-core machine, 15 steps for a 3 s answer). Stored as 8 bits a weight (ONNX
Runtime's dynamic quantisation: each output column of a weight matrix with its own scale,
each step's activations scaled as they come) the same steps read a quarter of the bytes.

Two choices keep the model the one we measured:

- **Unsigned weights.** u8 x u8 integer products are exact on every x86-64 kernel path
  (AVX2, AVX-512, VNNI, AMX); u8 x s8 ones saturate without VNNI, which moved smart-turn's
  scores with the CPU (:mod:`model_runtime.unsigned_weights`). The transcripts of the int8
  decoder therefore do not depend on the server's CPU any more than the float one's do.
- **The tied embedding.** The logits' MatMul takes the token embedding through a
  ``Transpose``, which the quantiser does not see as a weight, so a third of the weights (the
  32768 x 416 vocabulary) would stay float. It gets its own pre-transposed initializer first.

The encoder stays float: it runs once per clip (a fifth of a 3 s clip's ASR time), and
quantised it heard "one, two, three, four, five" as "one to three, four, five".
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from model_runtime.ort_convert import all_graphs, ort_to_onnx

__all__ = ["ort_to_onnx_int8", "untie_transposed_weights"]


def untie_transposed_weights(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place: a ``Transpose`` of a 2-D top-level initializer whose
    output only ever feeds MatMuls becomes an initializer of its own (the transposed copy,
    made once however many subgraphs transpose it), so a quantiser sees a MatMul weight.
    Returns how many Transpose nodes were removed."""
    top = model.graph
    inits = {t.name: t for t in top.initializer}
    graphs = list(all_graphs(top))
    consumers: dict[str, set[str]] = {}
    for g in graphs:
        for node in g.node:
            for name in node.input:
                consumers.setdefault(name, set()).add(node.op_type)
    made: dict[str, str] = {}
    removed = 0
    for g in graphs:
        keep, renamed = [], {}
        for node in g.node:
            source = node.input[0] if node.op_type == "Transpose" and node.input else ""
            tensor = inits.get(source)
            perm = [list(a.ints) for a in node.attribute if a.name == "perm"]
            if (
                tensor is None
                or len(tensor.dims) != 2
                or perm not in ([], [[1, 0]])
                or consumers.get(node.output[0], set()) != {"MatMul"}
            ):
                keep.append(node)
                continue
            if source not in made:
                made[source] = f"{source}.transposed"
                array = np.ascontiguousarray(numpy_helper.to_array(tensor).T)
                top.initializer.append(numpy_helper.from_array(array, made[source]))
            renamed[node.output[0]] = made[source]
            removed += 1
        if renamed:
            for node in keep:
                node.input[:] = [renamed.get(name, name) for name in node.input]
            del g.node[:]
            g.node.extend(keep)
    return removed


def ort_to_onnx_int8(src: Path, dst: Path) -> None:
    """The store's converter: the ``.ort`` decoder rebuilt as ONNX (:func:`ort_to_onnx`),
    its tied embedding untied, every MatMul weight quantised to uint8 per output column."""
    from onnxruntime.quantization import (  # type: ignore[import-untyped]
        QuantType,
        quantize_dynamic,
    )

    with tempfile.TemporaryDirectory(dir=dst.parent) as tmp:
        plain = Path(tmp) / "float.onnx"
        ort_to_onnx(src, plain)
        model = onnx.load(str(plain))
        if not untie_transposed_weights(model):
            raise ValueError(f"{src}: no transposed weight feeds a MatMul (not Moonshine's?)")
        untied = Path(tmp) / "untied.onnx"
        onnx.save(model, str(untied))
        del model
        quiet = logging.getLogger().level
        logging.getLogger().setLevel(logging.ERROR)  # its advice to pre-process: not needed
        try:
            quantize_dynamic(
                untied,
                dst,
                weight_type=QuantType.QUInt8,
                per_channel=True,
                op_types_to_quantize=["MatMul"],
                extra_options={"EnableSubgraph": True},
            )
        finally:
            logging.getLogger().setLevel(quiet)
