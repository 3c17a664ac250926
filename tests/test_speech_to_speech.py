"""Native speech-to-speech models on small ONNX graphs built here with onnx.helper.

"gain": out = audio * g + (previous frame's last sample), the last sample carried in a state
tensor; "delay": out = previous frame (state = this frame) times g. Their exact references
in numpy prove streaming, batching, state isolation and the agent's re-chunking.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from numpy.typing import NDArray
from onnx import TensorProto, helper

from agent.base import CallInfo
from agent.speech_to_speech import SpeechToSpeechAgent
from model_runtime.batching import TickBatcher
from model_runtime.speech_to_speech import SpeechModelSpec, SpeechToSpeechModel, StreamState
from testkit.agent_capture import Capture

N = 400  # model frame: 25 ms at 16 kHz (the bridge ticks 20 ms: 320 samples)
RATE = 16000
G = 0.5


def _save(path: Path, nodes: list[Any], inputs: list[Any], outputs: list[Any]) -> Path:
    init = [helper.make_tensor("g", TensorProto.FLOAT, [], [G])]
    graph = helper.make_graph(nodes, "s2s", inputs, outputs, initializer=init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _io(name: str, shape: list[Any], kind: int = TensorProto.FLOAT) -> Any:
    return helper.make_tensor_value_info(name, kind, shape)


def gain_model(path: Path, batch: Any = "B", n: Any = N, batched: bool = True) -> Path:
    """out = audio * g + prev; next prev = audio's last sample."""
    lead = [batch] if batched else []
    axis = 1 if batched else 0
    consts = [
        helper.make_node("Constant", [], ["st"], value_ints=[-1]),
        helper.make_node("Constant", [], ["en"], value_ints=[2**62]),
        helper.make_node("Constant", [], ["ax"], value_ints=[axis]),
    ]
    nodes = [
        *consts,
        helper.make_node("Mul", ["audio", "g"], ["scaled"]),
        helper.make_node("Add", ["scaled", "prev"], ["out"]),
        helper.make_node("Slice", ["audio", "st", "en", "ax"], ["last"]),
    ]
    return _save(
        path,
        nodes,
        [_io("audio", [*lead, n]), _io("prev", [*lead, 1])],
        [_io("out", [*lead, n]), _io("last", [*lead, 1])],
    )


def delay_model(path: Path) -> Path:
    """out = g * previous frame; next state = this frame."""
    nodes = [
        helper.make_node("Mul", ["held", "g"], ["out"]),
        helper.make_node("Identity", ["audio"], ["hold"]),
    ]
    return _save(
        path,
        nodes,
        [_io("audio", ["B", N]), _io("held", ["B", N])],
        [_io("out", ["B", N]), _io("hold", ["B", N])],
    )


def _gain_spec(path: Path, **kw: Any) -> SpeechModelSpec:
    args: dict[str, Any] = dict(
        path=path, input="audio", output="out", sample_rate=RATE, frame_samples=N,
        state=(("prev", "last"),),
    )  # fmt: skip
    args.update(kw)
    return SpeechModelSpec(**args)


def _gain_reference(x: NDArray[np.float32]) -> NDArray[np.float32]:
    """The whole signal at once: each frame * g plus the sample just before it."""
    frames = x.reshape(-1, N)
    before = np.concatenate([[0.0], frames[:-1, -1]]).astype(np.float32)
    out: NDArray[np.float32] = (frames * np.float32(G) + before[:, None]).reshape(-1)
    return out


def _signal(seed: int, frames: int = 30) -> NDArray[np.float32]:
    return np.random.default_rng(seed).uniform(-0.9, 0.9, frames * N).astype(np.float32)


def _stream(model: SpeechToSpeechModel, x: NDArray[np.float32]) -> NDArray[np.float32]:
    st = model.new_state()
    return np.concatenate([model.run(f[None], [st])[0] for f in x.reshape(-1, N)])


def test_streaming_equals_one_shot(tmp_path: Path) -> None:
    model = SpeechToSpeechModel(_gain_spec(gain_model(tmp_path / "g.onnx")))
    x = _signal(1)
    np.testing.assert_allclose(_stream(model, x), _gain_reference(x), rtol=0, atol=1e-6)


def test_delay_model_delays_by_one_frame(tmp_path: Path) -> None:
    spec = SpeechModelSpec(delay_model(tmp_path / "d.onnx"), "audio", "out", RATE, N,
                           state=(("held", "hold"),))  # fmt: skip
    model = SpeechToSpeechModel(spec)
    x = _signal(2)
    y = _stream(model, x)
    np.testing.assert_array_equal(y[:N], 0.0)
    np.testing.assert_array_equal(y[N:], x[:-N] * np.float32(G))


def test_batch_of_calls_equals_separate_calls(tmp_path: Path) -> None:
    model = SpeechToSpeechModel(_gain_spec(gain_model(tmp_path / "g.onnx")))
    signals = [_signal(10 + b) for b in range(5)]
    states = [model.new_state() for _ in signals]
    outs: list[list[NDArray[np.float32]]] = [[] for _ in signals]
    for k in range(30):
        batch = np.stack([s[k * N : (k + 1) * N] for s in signals])
        y = model.run(batch, states)
        assert y.shape == (5, N)
        for b in range(5):
            outs[b].append(y[b])
    for b, s in enumerate(signals):
        alone = _stream(model, s)
        np.testing.assert_array_equal(np.concatenate(outs[b]), alone)
        np.testing.assert_allclose(alone, _gain_reference(s), atol=1e-6)
        assert states[b].frames == 30


def test_states_are_isolated(tmp_path: Path) -> None:
    model = SpeechToSpeechModel(_gain_spec(gain_model(tmp_path / "g.onnx")))
    a, b = model.new_state(), model.new_state()
    model.run(np.full((1, N), 0.7, np.float32), [a])
    assert float(a.tensors["prev"][0]) == pytest.approx(0.7)
    assert float(b.tensors["prev"][0]) == 0.0  # untouched by a's run
    # in one batch, each call gets its own previous sample back
    y = model.run(np.zeros((2, N), np.float32), [a, b])
    assert np.allclose(y[0], 0.7) and np.allclose(y[1], 0.0)
    with pytest.raises(ValueError, match="twice"):
        model.run(np.zeros((2, N), np.float32), [a, a])


def test_run_batch_orders_several_frames_of_one_call(tmp_path: Path) -> None:
    """A call that queued two frames in one tick gets them in order, in two rounds."""
    model = SpeechToSpeechModel(_gain_spec(gain_model(tmp_path / "g.onnx")))
    x, z = _signal(3, 2), _signal(4, 1)
    sa, sb = model.new_state(), model.new_state()
    out = model.run_batch([(x[:N], sa), (z, sb), (x[N:], sa)])
    np.testing.assert_allclose(np.concatenate([out[0], out[2]]), _gain_reference(x), atol=1e-6)
    np.testing.assert_allclose(out[1], _gain_reference(z), atol=1e-6)


@pytest.mark.parametrize("variant", ["unbatched", "batch1"])
def test_models_without_a_batch_axis_run_call_by_call(tmp_path: Path, variant: str) -> None:
    if variant == "unbatched":
        spec = _gain_spec(gain_model(tmp_path / "u.onnx", batched=False), batch=False)
    else:
        spec = _gain_spec(gain_model(tmp_path / "one.onnx", batch=1))
    model = SpeechToSpeechModel(spec)
    signals = [_signal(20 + b, 5) for b in range(3)]
    states = [model.new_state() for _ in signals]
    y = [model.run(np.stack([s[k * N : (k + 1) * N] for s in signals]), states) for k in range(5)]
    for b, s in enumerate(signals):
        got = np.concatenate([frame[b] for frame in y])
        np.testing.assert_allclose(got, _gain_reference(s), atol=1e-6)


# -- the agent ----------------------------------------------------------------------------


class TickBatcherFake:
    """TickBatcher's contract: submit(item, done); flush() runs the batch, calls every done.
    ``reverse`` calls them last-first, to prove the agent restores frame order."""

    def __init__(self, run_batch: Callable[[list[Any]], list[Any]], reverse: bool = False) -> None:
        self.run_batch = run_batch
        self.reverse = reverse
        self.queue: list[tuple[Any, Callable[[Any], None]]] = []
        self.batch_sizes: list[int] = []

    def submit(self, item: Any, done: Callable[[Any], None]) -> None:
        self.queue.append((item, done))

    def flush(self) -> None:
        queue, self.queue = self.queue, []
        if not queue:
            return
        self.batch_sizes.append(len(queue))
        results = self.run_batch([item for item, _ in queue])
        pairs = list(zip(queue, results, strict=True))
        for (_, done), r in reversed(pairs) if self.reverse else pairs:
            done(r)


def _tone(seconds: float, hz: float = 1000.0, amp: float = 16000.0) -> NDArray[np.int16]:
    t = np.arange(round(seconds * RATE)) / RATE
    return np.rint(amp * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def _delay_agent(tmp_path: Path, batcher: Any = None) -> SpeechToSpeechAgent:
    spec = SpeechModelSpec(delay_model(tmp_path / "d.onnx"), "audio", "out", RATE, N,
                           state=(("held", "hold"),))  # fmt: skip
    return SpeechToSpeechAgent(SpeechToSpeechModel(spec), batcher=batcher)


def _drive(
    agents: list[SpeechToSpeechAgent], pcm: NDArray[np.int16], flush: Any = None
) -> list[Capture]:
    outs = [Capture() for _ in agents]
    for agent, out in zip(agents, outs, strict=True):
        asyncio.run(agent.start(CallInfo(call_id="c"), out))
    for k in range(pcm.size // 320):  # 20 ms ticks
        for agent in agents:
            agent.on_audio(pcm[k * 320 : (k + 1) * 320])
        if flush is not None:
            flush()
    return outs


def test_agent_tone_in_comes_out_as_the_same_tone(tmp_path: Path) -> None:
    agent = _delay_agent(tmp_path)
    assert agent.sample_rate == RATE
    pcm = _tone(1.0)
    (out,) = _drive([agent], pcm)
    y = out.audio.astype(np.float64)
    assert y.size == pcm.size  # 50 ticks of 320 = 40 frames of 400
    # exactly the input, one model frame late, at half the level (int16 rounding only)
    ref = G * pcm[: y.size - N].astype(np.float64)
    assert np.max(np.abs(y[N:] - ref)) <= 1.0
    seg = y[N:]
    spec = np.abs(np.fft.rfft(seg * np.hanning(seg.size)))
    assert abs(np.argmax(spec) * RATE / seg.size - 1000.0) < RATE / seg.size
    assert np.sqrt(2 * np.mean(seg**2)) == pytest.approx(G * 16000, rel=0.01)


@pytest.mark.parametrize("reverse", [False, True])
def test_agent_through_batcher_matches_direct(tmp_path: Path, reverse: bool) -> None:
    direct = [_delay_agent(tmp_path)]
    model = _delay_agent(tmp_path).model
    batcher = TickBatcherFake(model.run_batch, reverse=reverse)
    calls = [SpeechToSpeechAgent(model, batcher=batcher) for _ in range(3)]
    pcm = _tone(0.5, 700.0)
    want = _drive(direct, pcm)[0].audio
    got = _drive(calls, pcm, flush=batcher.flush)
    for out in got:
        np.testing.assert_array_equal(out.audio, want)
    assert max(batcher.batch_sizes) == 3  # one run served all three calls in a tick


def _with_tick_batcher(
    model: SpeechToSpeechModel, run_batch: Callable[[list[Any]], list[Any]], calls: int,
    pcm: NDArray[np.int16],
) -> tuple[list[SpeechToSpeechAgent], list[Capture], TickBatcher[Any, Any]]:  # fmt: skip
    """Drive ``calls`` agents on a running loop, 20 ms ticks, through the real TickBatcher."""

    async def main() -> tuple[list[SpeechToSpeechAgent], list[Capture], TickBatcher[Any, Any]]:
        batcher: TickBatcher[Any, Any] = TickBatcher(run_batch)
        agents = [SpeechToSpeechAgent(model, batcher=batcher) for _ in range(calls)]
        outs = [Capture() for _ in agents]
        for agent, out in zip(agents, outs, strict=True):
            await agent.start(CallInfo(call_id="c"), out)
        for k in range(pcm.size // 320):
            for agent in agents:
                agent.on_audio(pcm[k * 320 : (k + 1) * 320])
            await asyncio.sleep(0)  # the loop turn after the tick runs the batch
        return agents, outs, batcher

    return asyncio.run(main())


def test_agent_with_the_real_tick_batcher(tmp_path: Path) -> None:
    """TickBatcher runs each tick's frames of all calls as one batch after the tick."""
    model = _delay_agent(tmp_path).model
    pcm = _tone(0.5, 1000.0)
    want = _drive([_delay_agent(tmp_path)], pcm)[0].audio
    _, outs, batcher = _with_tick_batcher(model, model.run_batch, 4, pcm)
    for out in outs:
        np.testing.assert_array_equal(out.audio, want)
    assert batcher.stats.largest == 4 and batcher.stats.failed == 0


def test_agent_survives_a_failed_batch(tmp_path: Path) -> None:
    model = _delay_agent(tmp_path).model
    runs = {"n": 0}

    def flaky(items: list[Any]) -> list[Any]:
        runs["n"] += 1
        if runs["n"] == 3:
            raise RuntimeError("GPU fell over")
        return model.run_batch(items)

    (agent,), (out,), batcher = _with_tick_batcher(model, flaky, 1, _tone(0.2))
    assert batcher.stats.failed == 1 and agent.failed_frames == 1
    assert agent.frames_in == 8 and out.audio.size == 7 * N  # one frame lost, rest in order


def test_agent_stop_drops_late_results(tmp_path: Path) -> None:
    model = _delay_agent(tmp_path).model
    batcher = TickBatcherFake(model.run_batch)
    agent = SpeechToSpeechAgent(model, batcher=batcher)
    out = Capture()
    asyncio.run(agent.start(CallInfo(call_id="c"), out))
    agent.on_audio(_tone(0.05)[:800])
    asyncio.run(agent.stop())
    batcher.flush()
    assert out.sizes == []


# -- the spec against the graph -----------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"input": "pcm"}, "no input named 'pcm'.*audio, prev"),
        ({"output": "speech"}, "no output named 'speech'.*last, out"),
        ({"state": (("h0", "last"),)}, "no state input named 'h0'"),
        ({"state": (("prev", "h1"),)}, "no state output named 'h1'"),
        ({"state": ()}, r"inputs \['prev'\] are neither"),
        ({"frame_samples": 480}, "takes 400 samples; the spec says 480"),
        ({"batch": False}, "expected \\(frame_samples,\\)"),
    ],
)
def test_spec_errors_name_the_problem(tmp_path: Path, kw: dict[str, Any], match: str) -> None:
    path = gain_model(tmp_path / "g.onnx")
    with pytest.raises(ValueError, match=match):
        SpeechToSpeechModel(_gain_spec(path, **kw))


def test_spec_errors_on_types_shapes_and_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        SpeechToSpeechModel(_gain_spec(tmp_path / "none.onnx"))
    with pytest.raises(ValueError):
        _gain_spec(tmp_path / "x.onnx", frame_samples=0)
    # int16 audio input
    nodes = [helper.make_node("Identity", ["audio"], ["out"])]
    p = _save(tmp_path / "i.onnx", nodes, [_io("audio", ["B", N], TensorProto.INT16)],
              [_io("out", ["B", N], TensorProto.INT16)])  # fmt: skip
    with pytest.raises(ValueError, match="must be tensor\\(float\\)"):
        SpeechToSpeechModel(SpeechModelSpec(p, "audio", "out", RATE, N))
    # a state whose size is not fixed cannot be zero-initialised
    nodes = [helper.make_node("Identity", ["audio"], ["out"]),
             helper.make_node("Identity", ["h"], ["h2"])]  # fmt: skip
    p = _save(tmp_path / "h.onnx", nodes, [_io("audio", ["B", N]), _io("h", ["B", "H"])],
              [_io("out", ["B", N]), _io("h2", ["B", "H"])])  # fmt: skip
    with pytest.raises(ValueError, match=r"state 'h'.*fixed"):
        SpeechToSpeechModel(SpeechModelSpec(p, "audio", "out", RATE, N, state=(("h", "h2"),)))


def test_new_state_is_zero_and_typed(tmp_path: Path) -> None:
    model = SpeechToSpeechModel(_gain_spec(gain_model(tmp_path / "g.onnx")))
    st = model.new_state()
    assert isinstance(st, StreamState) and st.frames == 0
    assert st.tensors["prev"].shape == (1,) and st.tensors["prev"].dtype == np.float32
    assert not st.tensors["prev"].any()
    assert model.providers == ["CPUExecutionProvider"]


def test_a_speech_model_call_is_resampled_to_the_models_rate_and_back(tmp_path: Path) -> None:
    """The call's chain, as built for this agent: the line's 8 kHz up to the model's own
    rate (16 kHz here) and back, the resamplers around it and nowhere else."""
    from sip_bridge.media.call_media import CallMedia, MediaParams
    from sip_bridge.media.rtp_ports import RtpPortPool

    agent = SpeechToSpeechAgent(SpeechToSpeechModel(_gain_spec(gain_model(tmp_path / "g.onnx"))))
    media = CallMedia(agent, RtpPortPool(40000, 40001), MediaParams("127.0.0.1", 4000))
    assert media.describe() == (
        "RTP in -> G711Decode(PCMU) -> JitterBuffer(adaptive 20..200 ms) -> Resample(8k->16k)"
        " -> Agent(speech-to-speech) -> Resample(16k->8k) -> PlayoutBuffer(20 ms)"
        " -> G711Encode(PCMU) -> RTP out"
    )
