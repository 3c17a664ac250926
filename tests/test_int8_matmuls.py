"""Moonshine's decoder with uint8 matrix weights ([models] asr_weights = "int8").

First the untying of a transposed weight on a toy graph shaped like the merged decoder (an
If whose two branches both take the logits through a Transpose of the embedding), run by
ONNX Runtime before and after; then the store's int8 decoder: every matrix weight is
uint8 (the kernels that are exact on every CPU), and it hears a man, espeak callers and
digits as the float one does.
"""

from __future__ import annotations

import subprocess
import wave
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort  # type: ignore[import-untyped]
import pytest
from numpy.typing import NDArray
from onnx import TensorProto, helper, numpy_helper

from agent.voice.asr import MoonshineAsr
from model_runtime.int8_matmuls import untie_transposed_weights
from resample import Resampler
from testkit.models import model_file
from testkit.wer import wer_words, word_errors

VOCAB, DIM = 40, 6


def _branch(name: str, table: str) -> onnx.GraphProto:
    """logits = h @ table.T, as the merged decoder's branches compute them."""
    nodes = [
        helper.make_node("Transpose", [table], [f"{name}_t"], perm=[1, 0]),
        helper.make_node("MatMul", ["h", f"{name}_t"], [f"{name}_logits"]),
    ]
    out = helper.make_tensor_value_info(f"{name}_logits", TensorProto.FLOAT, [1, VOCAB])
    return helper.make_graph(nodes, name, [], [out])


def _toy(feeds_other: bool = False) -> onnx.ModelProto:
    table = np.random.default_rng(5).standard_normal((VOCAB, DIM)).astype(np.float32)
    nodes = [
        helper.make_node(
            "If",
            ["cached"],
            ["logits"],
            then_branch=_branch("then", "embed"),
            else_branch=_branch("else", "embed"),
        )
    ]
    if feeds_other:  # the transposed table also feeds an Add: it must stay as it is
        nodes = [
            helper.make_node("Transpose", ["embed"], ["embed_t"], perm=[1, 0]),
            helper.make_node("Add", ["embed_t", "embed_t"], ["twice"]),
            helper.make_node("MatMul", ["h", "embed_t"], ["logits"]),
        ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, VOCAB])]
    if feeds_other:
        outputs.append(helper.make_tensor_value_info("twice", TensorProto.FLOAT, [DIM, VOCAB]))
    graph = helper.make_graph(
        nodes,
        "toy",
        [
            helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, DIM]),
            helper.make_tensor_value_info("cached", TensorProto.BOOL, []),
        ],
        outputs,
        [numpy_helper.from_array(table, "embed")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(model: onnx.ModelProto, cached: bool) -> list[NDArray[np.float32]]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    s = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    h = np.linspace(-1, 1, DIM, dtype=np.float32)[None, :]
    names = {i.name for i in s.get_inputs()}
    feeds = {k: v for k, v in {"h": h, "cached": np.array(cached)}.items() if k in names}
    return [np.asarray(o) for o in s.run(None, feeds)]


def _transposes(model: onnx.ModelProto) -> int:
    count = 0
    for graph in [model.graph, *(a.g for n in model.graph.node for a in n.attribute if a.g.node)]:
        count += sum(n.op_type == "Transpose" for n in graph.node)
    return count


def test_a_transposed_weight_in_both_branches_becomes_one_initializer() -> None:
    model = _toy()
    before = [_run(model, c) for c in (False, True)]
    assert untie_transposed_weights(model) == 2
    assert _transposes(model) == 0
    names = [t.name for t in model.graph.initializer]
    assert names.count("embed.transposed") == 1
    for cached, outputs in zip((False, True), before, strict=True):
        np.testing.assert_array_equal(_run(model, cached)[0], outputs[0])


def test_a_transpose_that_feeds_more_than_matmuls_is_left_alone() -> None:
    model = _toy(feeds_other=True)
    assert untie_transposed_weights(model) == 0
    assert _transposes(model) == 1


# -- the store's int8 decoder ------------------------------------------------------------------

BECKETT = "ever tried ever failed no matter try again fail again fail better"
CALLERS = [
    "My order number is one two three four five.",
    "What are your opening hours?",
    "I need to cancel an order.",
    "Could I come in on Wednesday at ten?",
]


def _errors(ref: str, hyp: str) -> int:
    """Word-level edit distance, numbers as digits on both sides (testkit.wer)."""
    return word_errors(wer_words(ref), wer_words(hyp)).errors


def _asr(weights: str) -> MoonshineAsr:
    m = "moonshine-base-en"
    decoder = {"float": "decoder_model_merged.onnx", "int8": "decoder_model_merged-int8.onnx"}
    return MoonshineAsr(
        model_file(m, "encoder_model.onnx"),
        model_file(m, decoder[weights]),
        model_file(m, "tokenizer.json"),
        threads=2,
        device="cpu",
    )


@pytest.fixture(scope="module")
def int8() -> MoonshineAsr:
    return _asr("int8")


def _espeak_16k(text: str, tmp: Path) -> NDArray[np.int16]:
    wav = tmp / "said.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "160", "-w", str(wav), text], check=True)
    with wave.open(str(wav)) as w:
        x = np.frombuffer(w.readframes(w.getnframes()), np.int16)
    return Resampler(22050, 16000).process(np.concatenate([x, np.zeros(2205, np.int16)]))


def test_every_matrix_weight_of_the_int8_decoder_is_unsigned() -> None:
    """uint8 x uint8 products: exact on AVX2, AVX-512, VNNI and AMX alike."""
    model = onnx.load(str(model_file("moonshine-base-en", "decoder_model_merged-int8.onnx")))
    inits = {t.name: t.data_type for t in model.graph.initializer}
    weights = [
        n.input[1]
        for branch in (a.g for n in model.graph.node for a in n.attribute if a.g.node)
        for n in branch.node
        if n.op_type == "MatMulInteger" and n.input[1] in inits
    ]
    assert len(weights) > 100  # every projection of both branches, the logits' too
    assert {inits[w] for w in weights} == {TensorProto.UINT8}
    assert "model.decoder.embed_tokens.weight" in " ".join(inits)  # the Gather keeps its table


def test_the_int8_decoder_hears_a_man_and_callers_as_the_float_one(
    int8: MoonshineAsr, tmp_path: Path
) -> None:
    with wave.open(str(model_file("beckett", "beckett.wav"))) as w:
        beckett = np.frombuffer(w.readframes(w.getnframes()), np.int16)
    assert _errors(BECKETT, int8.transcribe(beckett)) <= 1
    plain = _asr("float")
    words = errors = 0
    for said in CALLERS:
        clip = _espeak_16k(said, tmp_path)
        heard = int8.transcribe(clip, words_expected=True)
        words += len(wer_words(said))
        errors += _errors(said, heard)
        before = plain.transcribe(clip, words_expected=True)
        assert _errors(said, heard) <= _errors(said, before) + 1, (heard, before)
    assert errors / words <= 0.1, errors
    order = int8.transcribe(_espeak_16k(CALLERS[0], tmp_path), words_expected=True)
    assert "".join(wer_words(order)).endswith("12345"), order
