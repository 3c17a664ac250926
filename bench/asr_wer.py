"""Word error rate on human telephone speech: the ASR alone, and through the bridge.

The clips are Debian's ``asterisk-core-sounds-en-wav``: 500+ prompts read by one woman
(Allison Smith), recorded for the telephone at 8 kHz, with their texts in
``core-sounds-en.txt.gz`` (package ``asterisk-core-sounds-en``). Each usable prompt is heard
two ways, side by side in one run:

- ``clean``: its 8 kHz PCM, resampled to 16 kHz, straight into Moonshine (the model alone).
- ``bridge``: the path a caller's voice takes. The prompt is cut into 20 ms frames, G.711
  encoded into RTP packets (``RtpSender``), received by the bridge's own
  ``RtpReceiver`` (G.711 decode) into its ``JitterBuffer`` (the shipped bridge.toml's
  delays), popped on the media clock's schedule (``next_tick``) and handed to a
  ``VoiceAgent`` built as ``make_agent`` builds it (the shipped bridge.toml's
  ``[agent.voice]`` settings, the shared ``VoiceModels``, the demo profile's barge-in
  and filler). The agent does the rest as on a call: its 8 -> 16 kHz resampler, Silero
  VAD (batched per tick), smart-turn and the silence timeout for end of turn, the
  ``IncrementalTranscriber``'s segments, speculation during pauses, merges of turns the
  caller went on from. What the bridge records of the caller is the transcript: the
  ``caller_text`` of each ``TurnCompleted`` the agent emits, joined.

Each prompt is one call: 0.5 s of line silence, the prompt, then silence until its turns
are answered. No sockets (the SIP/RTP wire is tested elsewhere) and faster than real time:
after each 20 ms tick the loop waits for the model jobs the tick started, so the agent
sees model results as a machine that keeps up would. The demo profile's greeting is
dropped (15 s of it before every prompt) and its fallback replies are one word ("Okay."):
what the agent says is not what is measured here, and it costs TTS time.

WER compares words as :mod:`testkit.wer` does (lower case, no punctuation, numbers as
digits on both sides). Prompts over ``--max-s`` seconds, or whose text has no words
(``[beep tone]``), are skipped and counted.

    .venv/bin/python bench/asr_wer.py                  # every usable prompt, ~15 min
    .venv/bin/python bench/asr_wer.py --limit 40       # a seeded sample
    .venv/bin/python bench/asr_wer.py --level-dbfs -35 --noise-snr-db 20 --codec PCMA
    .venv/bin/python bench/asr_wer.py --limit 60 --loss-pct 3   # bursty loss on the bridge path
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import random
import sys
import threading
import time
import wave
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple, ParamSpec, TypeVar

# The bridge in this process runs as `sip-bridge run` runs it: OpenBLAS on one thread, set
# before numpy loads (sip_bridge/cli.py says why).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
from numpy.typing import NDArray

from agent.base import CallInfo, TurnCompleted
from agent.dialogue.profile import AgentProfile, parse_template
from agent.dialogue.profile_loader import load_profile
from agent.voice.voice_agent import VoiceAgent
from agent.voice.voice_models import VoiceModels
from jitter import JitterBuffer
from resample import Resampler
from sip_bridge.config.loader import BridgeConfig, load_config
from sip_bridge.media.pacer import next_tick
from sip_bridge.media.rtp import RtpSender
from sip_bridge.media.rtp_receiver import CODECS, RtpReceiver
from sip_bridge.script.line_sim import PacketSchedule
from sip_bridge.script.script_cli import loss_pct_arg
from testkit.agent_capture import Capture
from testkit.line_echo import active_level_dbfs, line_noise
from testkit.wer import WordErrors, wer_words, word_errors

__all__ = ["BridgeListener", "Heard", "Prompt", "heard_clean", "line_audio", "load_prompts", "main"]

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
SOUNDS = Path("/usr/share/asterisk/sounds/en")
TEXTS = Path("/usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz")
RATE = 8000
FRAME = 160  # 20 ms at 8 kHz: one RTP packet, one agent tick
FRAME_S = FRAME / RATE
PAYLOAD_TYPES = {"PCMU": 0, "PCMA": 8}
CALLER = ("127.0.0.1", 40000)  # the RTP source the receiver expects (no socket is opened)
LEAD_S = 0.5  # line silence before the prompt
MIN_TAIL_S = 1.5  # silence after it before the call may end ...
MAX_TAIL_S = 8.0  # ... and at most this much (a turn never answered)
WORST = 20

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True)
class Prompt:
    name: str  # as in the transcripts: "vm-goodbye", "digits/7"
    text: str
    pcm: NDArray[np.int16]  # 8 kHz, as recorded

    @property
    def seconds(self) -> float:
        return self.pcm.size / RATE


def _read_wav(path: Path) -> NDArray[np.int16] | None:
    """8 kHz 16-bit mono PCM, else None (the package ships nothing else)."""
    with wave.open(str(path), "rb") as w:
        if (w.getframerate(), w.getsampwidth(), w.getnchannels()) != (RATE, 2, 1):
            return None
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.int16)


def load_prompts(
    sounds: Path = SOUNDS, texts: Path = TEXTS, max_s: float = 12.0
) -> tuple[list[Prompt], dict[str, int]]:
    """Every prompt with a recording and a text that has words, up to ``max_s`` long; and
    how many were skipped, by reason."""
    for path, package in ((sounds, "asterisk-core-sounds-en-wav"),
                          (texts, "asterisk-core-sounds-en")):  # fmt: skip
        if not path.exists():
            raise SystemExit(f"{path} is missing: install Debian's {package}")
    skipped = {"no_recording": 0, "no_words": 0, "too_long": 0, "not_8khz_mono": 0}
    prompts: list[Prompt] = []
    with gzip.open(texts, "rt", encoding="utf-8", errors="replace") as f:
        for line in f:
            name, sep, text = line.partition(":")
            name, text = name.strip(), text.strip()
            if not sep or not name or name.startswith(";"):
                continue
            wav = sounds / f"{name}.wav"
            if not wav.is_file():
                skipped["no_recording"] += 1
                continue
            if not wer_words(text):
                skipped["no_words"] += 1
                continue
            pcm = _read_wav(wav)
            if pcm is None:
                skipped["not_8khz_mono"] += 1
            elif pcm.size > max_s * RATE:
                skipped["too_long"] += 1
            else:
                prompts.append(Prompt(name, text, pcm))
    return prompts, skipped


def line_audio(
    prompt: Prompt, level_dbfs: float | None, snr_db: float | None, seed: int
) -> NDArray[np.int16]:
    """What the caller's phone sends: the prompt at ``level_dbfs`` of active speech (None:
    as recorded), with telephone-band hiss ``snr_db`` below that level (None: none)."""
    x = prompt.pcm.astype(np.float64)
    level = active_level_dbfs(x)
    if level_dbfs is not None:
        x *= 10 ** ((level_dbfs - level) / 20)
        level = level_dbfs
    if snr_db is not None:
        x = x + line_noise(x.size, level - snr_db, seed=seed)
    return np.clip(np.round(x), -32768, 32767).astype(np.int16)


def heard_clean(models: VoiceModels, pcm8k: NDArray[np.int16]) -> str:
    """The model alone: the clip at 16 kHz, transcribed whole."""
    up = Resampler(RATE, models.asr.sample_rate)
    return str(models.asr.transcribe(np.concatenate([up.process(pcm8k), up.flush()])))


class _Settling(ThreadPoolExecutor):
    """The models' executor, which knows what it has not finished (see :meth:`settle`)."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers, thread_name_prefix="voice-model")
        self._lock = threading.Lock()
        self._running: set[Future[Any]] = set()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        fut = super().submit(fn, *args, **kwargs)
        with self._lock:
            self._running.add(fut)
        fut.add_done_callback(self._done)
        return fut

    def _done(self, fut: Future[Any]) -> None:
        with self._lock:
            self._running.discard(fut)

    async def settle(self) -> None:
        """Until every job is done and what their results started (on the loop: more jobs,
        a reply) has run too."""
        quiet = 0
        while quiet < 3:
            await asyncio.sleep(0)
            with self._lock:
                running = list(self._running)
            if running:
                quiet = 0
                await asyncio.wait([asyncio.wrap_future(f) for f in running])
            else:
                quiet += 1


def listening_profile(profile: AgentProfile) -> AgentProfile:
    """``profile`` as the bench's calls use it: no greeting, "Okay." for what it does not
    understand (no escalation); barge-in, filler, intents and limits as they are."""
    fallback = replace(profile.fallback, replies=(parse_template("Okay."),), escalate_after=0)
    return replace(profile, greeting=parse_template(""), fallback=fallback)


class Heard(NamedTuple):
    """One call's transcript: its turns' ``caller_text`` joined; how many turns the agent
    reported; whether every turn was answered before ``MAX_TAIL_S`` of silence."""

    text: str
    turns: int
    answered: bool


@dataclass
class BridgeListener:
    """The bridge's receive path into a voice agent, one call per clip (see the module)."""

    config: BridgeConfig
    codec: str = "PCMU"  # the caller's G.711 law, PCMU or PCMA (may change between calls)
    loss_pct: float = 0.0  # bursty loss of the caller's packets (as `sip-bridge script`'s)
    seed: int = 1
    models: VoiceModels = field(init=False)
    profile: AgentProfile = field(init=False)
    _pool: _Settling = field(init=False)
    _calls: int = 0

    def __post_init__(self) -> None:
        demo = load_profile(Path(self.config.agent.voice_profile))
        self.profile = listening_profile(demo)
        self.models = VoiceModels(self.config.models, length_scale=demo.voice.length_scale)
        self.models.warm_up()
        self.models.executor.shutdown()
        self._pool = self.models.executor = _Settling(self.config.models.workers)

    def close(self) -> None:
        self.models.close()

    def stages(self) -> str:
        """The receive chain as the bridge's ``CallMedia.describe`` words it."""
        j = self.config.jitter
        agent = ("Agent(voice, 8 kHz: Resample(8k->16k), SileroVAD, EndOfTurn(smart-turn), "
                 "IncrementalTranscriber(Moonshine))")  # fmt: skip
        jitter = f"JitterBuffer(adaptive {j.min_delay_ms}..{j.max_delay_ms} ms)"
        return f"RTP in -> G711Decode({self.codec}) -> {jitter} -> {agent}"

    def _packets(self, pcm8k: NDArray[np.int16]) -> Iterator[bytes]:
        """The caller's RTP: the lead silence, the clip, then silence for ever."""
        pt = PAYLOAD_TYPES[self.codec]
        codec = CODECS[pt]
        sender = RtpSender(pt, rng=random.Random(self._calls))
        lead = np.zeros(round(LEAD_S * RATE), np.int16)
        x = np.concatenate([lead, pcm8k])
        x = np.concatenate([x, np.zeros(-x.size % FRAME, np.int16)])
        for i in range(0, x.size, FRAME):
            payload = codec.encode(x[i : i + FRAME]).tobytes()
            yield sender.next_rtp_packet(payload, FRAME).serialize()
        silence = codec.encode(np.zeros(FRAME, np.int16)).tobytes()
        while True:
            yield sender.next_rtp_packet(silence, FRAME).serialize()

    async def hear(self, pcm8k: NDArray[np.int16]) -> Heard:
        """One call: what the agent's turns say the caller said."""
        if self.codec not in PAYLOAD_TYPES:
            raise ValueError(f"codec {self.codec!r}: PCMU or PCMA")
        self._calls += 1
        line = PacketSchedule(self.loss_pct, seed=self.seed * 100_000 + self._calls)
        j = self.config.jitter
        jb = JitterBuffer(RATE, 20, j.min_delay_ms, j.max_delay_ms, follows_due=True)
        pt = PAYLOAD_TYPES[self.codec]
        rx = RtpReceiver(jb, CODECS[pt], pt, CALLER)
        a = self.config.agent
        agent = VoiceAgent(self.models, self.profile, a.voice, model_timeout_s=a.model_timeout_s)
        out = Capture(keep=False)
        await agent.start(CallInfo(call_id=f"asr-wer-{self._calls}", codec=self.codec), out)
        await self._pool.settle()
        end = LEAD_S + pcm8k.size / RATE
        rx_due = 0.0
        answered = False
        try:
            for k, datagram in enumerate(self._packets(pcm8k)):
                now = k * FRAME_S
                if line.next() is not None:
                    rx.receive(datagram, CALLER, now)
                while rx_due <= now + 1e-9:  # the media clock's pops, on its schedule
                    frame = jb.pop(rx_due)
                    rx_due = next_tick(rx_due, FRAME_S, jb.due_s, lag_s=0.0002)
                    out.tick += 1
                    agent.on_audio(frame)
                    await self._pool.settle()
                tail = now - end
                answered = tail >= MIN_TAIL_S and _answered(agent)
                if answered or tail >= MAX_TAIL_S:
                    break
        finally:
            await agent.stop()
        turns = [e for e in out.events if isinstance(e, TurnCompleted) and e.input == "speech"]
        text = " ".join(t.caller_text for t in turns if t.caller_text).strip()
        return Heard(text, len(turns), answered)


def _answered(agent: VoiceAgent) -> bool:
    """Every turn heard so far is answered (reported) or was nothing the ASR made out,
    nothing is playing, and no turn is open."""
    if not agent.turns or agent.playout.playing:
        return False
    return all(t.reported or (t.asr_done and not t.text) for t in agent.turns)


@dataclass
class _Tally:
    errors: WordErrors = field(default_factory=lambda: WordErrors(0, 0, 0, 0))
    clips: int = 0
    empty: int = 0
    seconds: float = 0.0  # wall time spent hearing
    cpu_s: float = 0.0
    turns: int = 0  # bridge: turns the agent reported
    unanswered: int = 0  # bridge: calls that ended at MAX_TAIL_S with a turn not answered

    def add(self, e: WordErrors, heard: str, wall: float, cpu: float) -> None:
        self.errors += e
        self.clips += 1
        self.empty += not wer_words(heard)
        self.seconds += wall
        self.cpu_s += cpu

    def figures(self, audio_s: float) -> dict[str, Any]:
        e = self.errors
        bridge = {"turns": self.turns, "unanswered_calls": self.unanswered} if self.turns else {}
        return {
            "wer_pct": round(e.wer_pct, 2),
            "substitutions": e.substitutions, "deletions": e.deletions,
            "insertions": e.insertions, "words": e.words, "clips": self.clips,
            "empty_transcripts": self.empty,
            "rtf": round(self.seconds / audio_s, 3) if audio_s else None,
            "cpu_rtf": round(self.cpu_s / audio_s, 3) if audio_s else None,
        } | bridge  # fmt: skip


def by_folder(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """WER by the package's folders: "prompts" (the top level: phrases and sentences),
    "digits", "letters", "phonetic" (one word each), "dictate", "followme"."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        folder, _, _ = r["name"].rpartition("/")
        groups.setdefault(folder or "prompts", []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for name, rs in sorted(groups.items()):
        words = sum(r["words"] for r in rs)
        out[name] = {"clips": len(rs), "words": words} | {
            f"{cond}_wer_pct": round(100 * sum(r[cond]["errors"] for r in rs) / words, 2)
            for cond in ("clean", "bridge")
        }
    return out


def _timed(fn: Callable[[], T]) -> tuple[T, float, float]:
    w, c = time.monotonic(), time.process_time()
    out = fn()
    return out, time.monotonic() - w, time.process_time() - c


async def run(args: argparse.Namespace) -> dict[str, Any]:
    prompts, skipped = load_prompts(Path(args.sounds), Path(args.texts), args.max_s)
    usable = len(prompts)
    if args.limit and args.limit < usable:
        prompts = sorted(random.Random(args.seed).sample(prompts, args.limit), key=lambda p: p.name)
    config = load_config(ROOT / "config" / "bridge.toml")
    t0 = time.monotonic()
    listener = BridgeListener(config, args.codec, args.loss_pct, args.seed)
    load_s = time.monotonic() - t0
    tallies = {"clean": _Tally(), "bridge": _Tally()}
    rows: list[dict[str, Any]] = []
    audio_s = 0.0
    try:
        for i, p in enumerate(prompts):
            line = line_audio(p, args.level_dbfs, args.noise_snr_db, args.seed + i)
            ref = wer_words(p.text)
            row: dict[str, Any] = {"name": p.name, "seconds": round(p.seconds, 2), "text": p.text}
            clean, wall, cpu = _timed(lambda: heard_clean(listener.models, line))  # noqa: B023
            e = word_errors(ref, wer_words(clean))
            tallies["clean"].add(e, clean, wall, cpu)
            row["clean"] = {"heard": clean, "errors": e.errors}
            w, c = time.monotonic(), time.process_time()
            bridged = await listener.hear(line)
            e = word_errors(ref, wer_words(bridged.text))
            tallies["bridge"].add(e, bridged.text, time.monotonic() - w, time.process_time() - c)
            tallies["bridge"].turns += bridged.turns
            tallies["bridge"].unanswered += not bridged.answered
            row["bridge"] = {"heard": bridged.text, "errors": e.errors, "turns": bridged.turns,
                             "answered": bridged.answered}  # fmt: skip
            rows.append(row | {"words": len(ref)})
            audio_s += p.seconds
            if args.progress:
                print(f"{i + 1}/{len(prompts)} {p.name}: clean {row['clean']['errors']}, "
                      f"bridge {e.errors} / {len(ref)}", file=sys.stderr)  # fmt: skip
    finally:
        listener.close()

    def worst(cond: str) -> list[dict[str, Any]]:
        ranked = sorted(rows, key=lambda r: (-r[cond]["errors"] / r["words"], r["name"]))
        return [{"name": r["name"], "reference": r["text"], "heard": r[cond]["heard"],
                 "errors": r[cond]["errors"], "words": r["words"]}
                for r in ranked[:WORST] if r[cond]["errors"]]  # fmt: skip

    return {
        "bench": "asr_wer",
        "corpus": "asterisk-core-sounds-en (Allison Smith, 8 kHz)",
        "prompts_usable": usable,
        "prompts_run": len(prompts),
        "skipped": skipped,
        "max_s": args.max_s,
        "audio_s": round(audio_s, 1),
        "codec": args.codec,
        "level_dbfs": args.level_dbfs,
        "noise_snr_db": args.noise_snr_db,
        "loss_pct": args.loss_pct,
        "seed": args.seed,
        "bridge_path": listener.stages(),
        "conditions": {k: t.figures(audio_s) for k, t in tallies.items()},
        "by_folder": by_folder(rows),
        "worst": {k: worst(k) for k in tallies},
        "model_load_s": round(load_s, 1),
        "cpus": os.cpu_count(),
        "load_avg": round(os.getloadavg()[0], 2),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=0, help="a seeded sample of N prompts (0: all)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--level-dbfs",
        type=float,
        default=None,
        help="active speech level of every prompt (default: as recorded)",
    )
    p.add_argument(
        "--noise-snr-db",
        type=float,
        default=None,
        help="telephone-band hiss this many dB below the speech (default: none)",
    )
    p.add_argument("--codec", choices=sorted(PAYLOAD_TYPES), default="PCMU")
    p.add_argument(
        "--loss-pct",
        type=loss_pct_arg,
        default=0.0,
        help="bursty loss of the caller's packets on the bridge path (Gilbert-Elliott, mean "
        "burst 3 packets, as `sip-bridge script --loss-pct`); the clean path has none",
    )
    p.add_argument("--max-s", type=float, default=12.0, help="skip longer prompts")
    p.add_argument("--sounds", default=str(SOUNDS))
    p.add_argument("--texts", default=str(TEXTS))
    p.add_argument("--out", default=str(OUT / "asr_wer.json"))
    p.add_argument("--progress", action="store_true", help="one line per prompt on stderr")
    args = p.parse_args(argv)
    result = asyncio.run(run(args))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
