"""Piper text-to-speech (voice en_US-joe-medium), spoken sentence by sentence, cancellable.

Why our own session instead of ``piper.PiperVoice``: we choose threads and providers (one
place for every model), and we make the voice deterministic. Piper's VITS graph draws its
duration and latent noise with ``RandomNormalLike``, whose generator lives in the session,
so the same text sounds (and lasts) a little different every time. We replace that noise,
in memory, with a fixed table indexed by position: same text, same samples, the same
voice quality as trained. Piper itself (GPL-3.0-or-later, with espeak-ng) supplies only
the phonemes and the phoneme-id mapping.

Audio shaping for the phone: a fixed gain (not Piper's per-sentence peak normalisation, so
sentences keep one loudness), leading and trailing silence trimmed (the first sample
heard is speech), then a short pause after each piece (longer after ``.?!`` than after a
comma) so consecutive pieces sound like one reply.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
from numpy.typing import NDArray
from onnx import TensorProto, helper, numpy_helper
from piper.config import PiperConfig
from piper.phoneme_ids import phonemes_to_ids
from piper.phonemize_espeak import EspeakPhonemizer

from agent.dialogue.sentences import split_sentences
from model_runtime.sessions import Device, create_session

__all__ = ["MODEL", "MODEL_CONFIG_FILE", "MODEL_FILE", "PiperTts", "normalize_for_speech"]

MODEL = "piper-joe-medium"
MODEL_FILE = "en_US-joe-medium.onnx"
MODEL_CONFIG_FILE = "en_US-joe-medium.onnx.json"

_NOISE_TABLE_SIZE = 1 << 18  # > 192 latent channels x 26 s of frames: no repeat in a sentence
_NOISE_SEED = 20250705
_FRAME_S = 0.005  # silence-trim resolution
_TRIM_REL_DB = -45.0  # quieter than this below the loudest frame counts as silence
_TRIM_FLOOR_DB = -60.0  # ... and anything under this dBFS always does
_LEAD_S = 0.010  # kept before the first speech frame
_TAIL_S = 0.040  # kept after the last one (final consonants decay)
_PEAK_LIMIT = 0.89  # -1 dBFS: headroom for the resampler's overshoot


# ---- text normalisation ---------------------------------------------------------------

_REPLACEMENTS: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    # espeak reads "Dr." / "Mr." as a sentence end (a falling pause in mid-name)
    (re.compile(r"\bDr\.(?=\s)"), "Doctor"),
    (re.compile(r"\bMrs\.(?=\s)"), "Missus"),
    (re.compile(r"\bMr\.(?=\s)"), "Mister"),
    (re.compile(r"\bMs\.(?=\s)"), "Miz"),
    (re.compile(r"\bProf\.(?=\s)"), "Professor"),
    (re.compile(r"\bSt\.(?=\s+[A-Z])"), "Saint"),
    (re.compile(r"\bvs\.(?=\s)"), "versus"),
    (re.compile(r"\be\.g\.(?=[\s,]|$)"), "for example"),
    (re.compile(r"\bi\.e\.(?=[\s,]|$)"), "that is"),
    # espeak says "five zero zero" for 5:00; 9:30 it reads well ("nine thirty")
    (re.compile(r"\b(\d{1,2}):00(?=\s*[AaPp]\.?[Mm]\b)"), r"\1"),
    (re.compile(r"\b(\d{1,2}):00\b"), r"\1 o'clock"),
    # "#12345" is "hash twelve thousand..." otherwise; "$4.50" is "dollar four point five zero"
    (re.compile(r"#\s?(?=\d)"), "number "),
    (
        re.compile(r"\$(\d+)(?:\.(\d\d))?\b"),
        lambda m: f"{m[1]} dollar{'' if m[1] == '1' else 's'}" + (f" {m[2]}" if m[2] else ""),
    ),
)


def normalize_for_speech(text: str) -> str:
    """Rewrite what espeak reads badly on the phone; numbers themselves are left to espeak
    ("12345" is "twelve thousand three hundred forty five")."""
    for pattern, repl in _REPLACEMENTS:
        text = pattern.sub(repl, text)
    return text


# ---- espeak phonemes (one process-wide instance: espeak-ng is a C singleton) -------------

_espeak: EspeakPhonemizer | None = None
_espeak_lock = threading.Lock()


def _phonemes(voice: str, text: str, clusters: set[tuple[str, ...]] | None) -> list[str]:
    """The phonemes of ``text`` as one utterance (espeak's sentences joined by a space)."""
    global _espeak
    with _espeak_lock:
        if _espeak is None:
            _espeak = EspeakPhonemizer()
        sentences = _espeak.phonemize(voice, text, vowel_clusters=clusters)
    out: list[str] = []
    for s in sentences:
        if s:
            if out:
                out.append(" ")
            out.extend(s)
    return out


# ---- the model --------------------------------------------------------------------------


def _default_path(file: str) -> Path:
    from model_runtime.store import default_store

    return default_store().path(MODEL, file)


def fix_noise(model: onnx.ModelProto, seed: int = _NOISE_SEED) -> int:
    """Replace every ``RandomNormalLike(x)`` with ``table[(offset + i) % N]`` shaped like
    ``x`` (a fixed standard-normal table): deterministic synthesis. Returns how many nodes
    were replaced (0 for a model already fixed)."""
    graph = model.graph
    count = len([n for n in graph.node if n.op_type == "RandomNormalLike"])
    if count == 0:
        return 0
    table = np.random.default_rng(seed).standard_normal(_NOISE_TABLE_SIZE).astype(np.float32)
    graph.initializer.extend(
        [
            numpy_helper.from_array(table, "fixed_noise/table"),
            numpy_helper.from_array(np.array(0, np.int64), "fixed_noise/zero"),
            numpy_helper.from_array(np.array(1, np.int64), "fixed_noise/one"),
            numpy_helper.from_array(np.array(_NOISE_TABLE_SIZE, np.int64), "fixed_noise/n"),
        ]
    )
    nodes: list[onnx.NodeProto] = []
    k = 0
    for node in graph.node:  # replacements go where the originals were: order stays valid
        if node.op_type != "RandomNormalLike":
            nodes.append(node)
            continue
        offset = k * _NOISE_TABLE_SIZE // count  # each node reads its own stretch
        nodes += _fixed_noise_nodes(graph, node, f"fixed_noise/{k}/", offset)
        k += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return count


def _fixed_noise_nodes(
    graph: onnx.GraphProto, node: onnx.NodeProto, p: str, offset: int
) -> list[onnx.NodeProto]:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    dtype = int(attrs.get("dtype", TensorProto.FLOAT))
    if dtype != TensorProto.FLOAT:
        raise ValueError(f"{node.name}: RandomNormalLike of dtype {dtype}, expected float")
    consts: dict[str, NDArray[np.generic]] = {
        "offset": np.array(offset, np.int64),
        "scale": np.array(attrs.get("scale", 1.0), np.float32),
        "mean": np.array(attrs.get("mean", 0.0), np.float32),
    }
    graph.initializer.extend(numpy_helper.from_array(v, p + n) for n, v in consts.items())
    x, y = node.input[0], node.output[0]
    zero, one = "fixed_noise/zero", "fixed_noise/one"
    return [
        helper.make_node("Size", [x], [p + "size"]),
        helper.make_node("Range", [zero, p + "size", one], [p + "i"]),
        helper.make_node("Add", [p + "i", p + "offset"], [p + "j"]),
        helper.make_node("Mod", [p + "j", "fixed_noise/n"], [p + "m"]),
        helper.make_node("Gather", ["fixed_noise/table", p + "m"], [p + "g"], axis=0),
        helper.make_node("Shape", [x], [p + "shape"]),
        helper.make_node("Reshape", [p + "g", p + "shape"], [p + "r"]),
        helper.make_node("Mul", [p + "r", p + "scale"], [p + "rs"]),
        helper.make_node("Add", [p + "rs", p + "mean"], [y]),
    ]


def _frame_db(x: NDArray[np.float32], frame: int) -> NDArray[np.float64]:
    n = len(x) // frame
    frames = x[: n * frame].astype(np.float64).reshape(n, frame)
    db: NDArray[np.float64] = 10.0 * np.log10(np.mean(frames * frames, axis=1) + 1e-12)
    return db


class PiperTts:
    """One Piper voice; thread-safe (many calls may share one instance)."""

    sample_rate = 22050

    def __init__(
        self,
        model: Path | None = None,
        config: Path | None = None,
        *,
        threads: int = 1,
        length_scale: float | None = None,
        gain_db: float = 3.0,
        sentence_pause_s: float = 0.25,
        comma_pause_s: float = 0.08,
        device: Device = "auto",
    ) -> None:
        """``model``/``config`` default to the model store's files; ``length_scale`` > 1
        speaks slower (default: the voice's own, 1.0); ``gain_db`` applies to the model's
        raw output (about -23 dBFS RMS, peaks near -6 dBFS)."""
        if threads < 1:
            raise ValueError("threads must be >= 1")
        if model is None:
            model = _default_path(MODEL_FILE)
            config = config if config is not None else _default_path(MODEL_CONFIG_FILE)
        model = Path(model)
        config = Path(config) if config is not None else model.with_name(model.name + ".json")
        if not model.is_file():
            raise FileNotFoundError(f"Piper voice model not found: {model}")
        if not config.is_file():
            raise FileNotFoundError(f"Piper voice config not found: {config}")
        with open(config, encoding="utf-8") as f:
            self.config = PiperConfig.from_dict(json.load(f))
        self.sample_rate = self.config.sample_rate
        graph = onnx.load(str(model))
        fix_noise(graph)
        self._session = create_session(
            Path(model), model=graph.SerializeToString(), name=MODEL, threads=threads, device=device
        )
        self._inputs = {i.name for i in self._session.get_inputs()}
        #: which voice speaks (its model file and speaker): the phrase cache keys by it
        self.voice_name = f"{model.name}#{self.config.default_speaker_id}"
        self._scales = np.array(
            [
                self.config.noise_scale,
                self.config.length_scale if length_scale is None else length_scale,
                self.config.noise_w_scale,
            ],
            dtype=np.float32,
        )
        self._gain = float(10.0 ** (gain_db / 20.0))
        self._pause = round(sentence_pause_s * self.sample_rate)
        self._comma_pause = round(comma_pause_s * self.sample_rate)

    @property
    def length_scale(self) -> float:
        """The speed spoken at (> 1: slower)."""
        return float(self._scales[1])

    def phonemes(self, sentence: str) -> str:
        """The IPA phonemes spoken for ``sentence`` (after :func:`normalize_for_speech`)."""
        return "".join(self._phoneme_list(sentence))

    def _phoneme_list(self, sentence: str) -> list[str]:
        clusters = self.config.vowel_clusters
        return _phonemes(
            self.config.espeak_voice,
            normalize_for_speech(sentence),
            set(clusters) if clusters else None,
        )

    def raw(self, sentence: str) -> NDArray[np.float32]:
        """The model's own float output for ``sentence``: no gain, trim or pause."""
        phonemes = self._phoneme_list(sentence)
        if not any(p.strip() for p in phonemes):
            return np.zeros(0, np.float32)
        ids = phonemes_to_ids(phonemes, self.config.phoneme_id_map)
        feeds: dict[str, NDArray[np.generic]] = {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": self._scales,
        }
        if "sid" in self._inputs:
            feeds["sid"] = np.array([self.config.default_speaker_id], dtype=np.int64)
        out = self._session.run(None, feeds)[0]
        return np.asarray(out, dtype=np.float32).reshape(-1)

    def synthesize(self, sentence: str) -> NDArray[np.int16]:
        """One sentence (or piece) as int16 at :attr:`sample_rate`: speech from the first
        sample, then the pause that belongs after it. Empty for text with nothing to say."""
        audio = self._trim(self.raw(sentence))
        if audio.size == 0:
            return np.zeros(0, np.int16)
        audio = audio * self._gain
        peak = float(np.max(np.abs(audio)))
        if peak > _PEAK_LIMIT:
            audio *= _PEAK_LIMIT / peak
        ends_sentence = sentence.rstrip().rstrip("\"')]}»”’")[-1:] in (".", "!", "?", "…")
        pause = self._pause if ends_sentence else self._comma_pause
        pcm = np.zeros(audio.size + pause, np.int16)
        pcm[: audio.size] = np.round(audio * 32767.0).astype(np.int16)
        return pcm

    def stream(
        self, text: str, cancel: threading.Event | None = None
    ) -> Iterator[NDArray[np.int16]]:
        """``text`` piece by piece (see :func:`agent.dialogue.sentences.split_sentences`): each
        piece's audio is yielded as soon as it exists. ``cancel`` (barge-in) is checked
        before each piece and again before yielding it, so no stale audio comes out."""
        for piece in split_sentences(text):
            if cancel is not None and cancel.is_set():
                return
            pcm = self.synthesize(piece)
            if cancel is not None and cancel.is_set():
                return
            if pcm.size:
                yield pcm

    def warm_up(self) -> None:
        """Pay espeak's start-up and ONNX Runtime's first-run allocations before a call."""
        for _ in range(2):
            self.synthesize("Hello, how can I help?")

    def _trim(self, audio: NDArray[np.float32]) -> NDArray[np.float32]:
        frame = max(1, round(_FRAME_S * self.sample_rate))
        if audio.size < frame:
            return np.zeros(0, np.float32)
        db = _frame_db(audio, frame)
        threshold = max(float(db.max()) + _TRIM_REL_DB, _TRIM_FLOOR_DB)
        loud = np.flatnonzero(db > threshold)
        if loud.size == 0:
            return np.zeros(0, np.float32)
        start = max(0, int(loud[0]) * frame - int(_LEAD_S * self.sample_rate))
        stop = min(audio.size, (int(loud[-1]) + 1) * frame + int(_TAIL_S * self.sample_rate))
        return audio[start:stop].copy()
