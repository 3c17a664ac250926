"""How far each speech model's output moves between CPU kernel paths, on one machine.

ONNX Runtime picks its kernels by what the CPU offers (AVX2, AVX-512, AVX-512 VNNI, AMX),
so the same model gives other numbers on another server. This bench runs the same inputs
through every model twice, natively and under ``qemu-x86_64 -cpu Haswell`` (Debian's
``qemu-user``: the AVX2 path, whatever this CPU has), and reports what moved:

- smart-turn: P(turn complete) per window (beckett's sentence ends and mid-word cuts, the
  demo's questions by espeak-ng, human prompts cut at their pauses), for the shipped int8
  graph run as ONNX Runtime fuses it and as :class:`agent.voice.turn.SmartTurn` runs it; the
  number of end-of-turn decisions that flip at the shipped threshold.
- Silero VAD: per-window speech probability; windows whose speech decision flips.
- Moonshine: tokens and transcripts; clips transcribed differently.
- Piper: the waveform of fixed sentences; level of the difference relative to the speech.

    .venv/bin/python bench/kernel_drift.py                # native vs Haswell, JSON out
    .venv/bin/python bench/kernel_drift.py --quick        # fewer windows and clips

Emulation is slow (a smart-turn run takes ~20 s under qemu): the whole run takes
10-30 minutes on 2 cores. ``--worker`` is the half that runs under each path.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from agent.voice.turn import SmartTurn
from model_runtime.store import default_store
from resample.resampler import Resampler

ROOT = Path(__file__).resolve().parents[1]

OUT = ROOT / "bench" / "out"
THRESHOLD = 0.5  # the shipped agent.voice.turn_threshold
PAUSE_S = 0.2  # EndOfTurn asks the model this long into a pause (agent.voice.pause_ms)
QUESTIONS = (  # what the demo is asked in the tests and the README
    "What are your opening hours?",
    "I would like to check the status of my order.",
    "Can I speak to a person, please?",
    "Great, thanks. That's all.",
)
VOICES = ("en-us", "en+f3")
HUMAN = (  # Debian's asterisk-core-sounds-en-wav: a woman's telephone prompts, 8 kHz
    "agent-incorrect",
    "confbridge-pin",
    "demo-echotest",
    "vm-intro",
    "conf-getpin",
    "queue-thankyou",
)
HUMAN_DIR = Path("/usr/share/asterisk/sounds/en_US_f_Allison")
SENTENCES = (
    "Thank you for calling. How can I help you today?",
    "We're open Monday to Friday, 8 a.m. to 6 p.m., and Saturday 9 to 1.",
)


def _read_wav(path: Path) -> tuple[NDArray[np.int16], int]:
    with wave.open(str(path)) as w:
        if w.getnchannels() != 1 or w.getsampwidth() != 2:
            raise ValueError(f"{path}: expected 16-bit mono")
        return np.frombuffer(w.readframes(w.getnframes()), np.int16).copy(), w.getframerate()


def _resample(x: NDArray[np.int16], src: int, dst: int) -> NDArray[np.int16]:
    if src == dst:
        return x
    r = Resampler(src, dst)
    y = np.concatenate([r.process(x), r.flush()])
    return y.astype(np.int16)


def _espeak(text: str, voice: str, tmp: Path) -> NDArray[np.int16]:
    wav = tmp / "q.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-s", "160", "-w", str(wav), text], check=True)
    x, rate = _read_wav(wav)
    return _resample(x, rate, 16000)


def pauses(x: NDArray[np.int16], rate: int, min_gap_s: float = 0.25) -> list[tuple[int, int]]:
    """(start, end) samples of each loud run, runs closer than ``min_gap_s`` joined: where
    a speaker pauses, found by a 20 ms energy envelope 30 dB under the loudest frame."""
    frame = rate // 50
    f = x[: x.size // frame * frame].astype(np.float64).reshape(-1, frame)
    db = 10 * np.log10(np.mean(f**2, axis=1) + 1.0)
    loud = np.flatnonzero(db > db.max() - 30)
    runs: list[list[int]] = []
    for i in loud:
        if runs and i - runs[-1][1] <= round(min_gap_s * 50):
            runs[-1][1] = int(i)
        else:
            runs.append([int(i), int(i)])
    return [(a * frame, (b + 1) * frame) for a, b in runs if b - a >= 4]


def prepare(quick: bool) -> dict[str, Any]:
    """The inputs, made natively (espeak-ng and the resampler are not under test)."""
    store = default_store()
    beckett, _ = _read_wav(store.path("beckett", "beckett.wav"))
    clips16: dict[str, NDArray[np.int16]] = {"beckett": beckett}
    with tempfile.TemporaryDirectory() as tmp:
        for v in VOICES[: 1 if quick else None]:
            for i, q in enumerate(QUESTIONS[: 2 if quick else None]):
                clips16[f"espeak-{v}-{i}"] = np.concatenate(
                    [np.zeros(8000, np.int16), _espeak(q, v, Path(tmp)), np.zeros(8000, np.int16)]
                )
    if HUMAN_DIR.is_dir():
        for name in HUMAN[: 2 if quick else None]:
            x, r = _read_wav(HUMAN_DIR / f"{name}.wav")
            clips16[f"human-{name}"] = _resample(x, r, 16000)
    windows: dict[str, NDArray[np.int16]] = {}
    for name, x in clips16.items():
        runs = pauses(x, 16000)
        for k, (a, b) in enumerate(runs):
            start = max(0, runs[0][0] - 8000)
            windows[f"{name}/end{k + 1}"] = x[start : b + round(PAUSE_S * 16000)]
            if name == "beckett":  # cut mid-word, from half a second before the sentence
                windows[f"{name}/mid{k + 1}"] = x[max(0, a - 8000) : (a + b) // 2]
    if quick:
        windows = dict(list(windows.items())[:10])
    return {
        "windows": windows,
        "clips16": clips16,
        "clips8": {k: _resample(v, 16000, 8000) for k, v in clips16.items()},
    }


def _vad_probs(vad: Any, x8: NDArray[np.int16]) -> list[float]:
    from agent.voice.vad import VadStream

    stream = VadStream(vad)
    out: list[float] = []
    for i in range(0, x8.size - 159, 160):
        out.extend(stream.push(x8[i : i + 160]))
    return out


MODELS = ("smart_turn", "silero_vad", "moonshine", "piper")


def worker(model: str, inputs: Path, output: Path) -> None:
    """One model on every input, on whatever kernels this process's CPU selects; progress
    on stderr (under emulation a model takes minutes)."""
    import onnxruntime as ort  # type: ignore[import-untyped]

    data = np.load(inputs, allow_pickle=True)
    windows: dict[str, NDArray[np.int16]] = data["windows"].item()
    clips16: dict[str, NDArray[np.int16]] = data["clips16"].item()
    clips8: dict[str, NDArray[np.int16]] = data["clips8"].item()
    out: dict[str, Any] = {}
    t = time.perf_counter()

    def each(items: dict[str, Any], fn: Any) -> dict[str, Any]:
        done = {}
        for k, v in items.items():
            done[k] = fn(v)
            print(f"  {model} {k}: {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
        return done

    if model == "smart_turn":
        turn = SmartTurn(threads=1)
        out["graph"] = turn.path.name
        out["smart_turn"] = each(windows, turn.probability)
        fused = ort.InferenceSession(
            str(default_store().path("smart-turn-v3.2", "smart-turn-v3.2-cpu.onnx")),
            providers=["CPUExecutionProvider"],
        )
        feed = fused.get_inputs()[0].name
        out["smart_turn_fused_int8"] = each(
            windows,
            lambda x: float(
                np.asarray(fused.run(None, {feed: turn.features(x)[None]})[0]).ravel()[0]
            ),
        )
    elif model == "silero_vad":
        from agent.voice.vad import SileroVad

        vad = SileroVad(threads=1)
        out["silero_vad"] = each(clips8, lambda x: _vad_probs(vad, x))
    elif model == "moonshine":
        from agent.voice.asr import MoonshineAsr

        asr = MoonshineAsr(threads=1, device="cpu")
        out["moonshine"] = each(clips16, asr.tokens)
        out["moonshine_text"] = {
            k: asr.tokenizer.decode(tok).strip() for k, tok in out["moonshine"].items()
        }
    elif model == "piper":
        from agent.voice.tts import PiperTts

        tts = PiperTts(threads=1, device="cpu")
        out["piper"] = each({s: s for s in SENTENCES}, lambda s: tts.raw(s).tolist())
    else:
        raise SystemExit(f"unknown model {model!r}")
    out["seconds"] = time.perf_counter() - t
    output.write_text(json.dumps(out))


def _flips(a: dict[str, float], b: dict[str, float]) -> list[dict[str, Any]]:
    return [
        {"window": k, "native": round(a[k], 4), "avx2": round(b[k], 4)}
        for k in a
        if (a[k] >= THRESHOLD) != (b[k] >= THRESHOLD)
    ]


def _prob_drift(a: dict[str, float], b: dict[str, float]) -> dict[str, Any]:
    d = np.array([abs(a[k] - b[k]) for k in a])
    return {
        "windows": len(a),
        "max_abs_diff": round(float(d.max()), 6),
        "mean_abs_diff": round(float(d.mean()), 6),
        "decisions_flipped": _flips(a, b),
    }


def compare(native: dict[str, Any], avx2: dict[str, Any]) -> dict[str, Any]:
    """What moved between the two runs, model by model (those that ran)."""
    report: dict[str, Any] = {}
    if "smart_turn" in native:
        report["smart_turn (as the agent runs it)"] = _prob_drift(
            native["smart_turn"], avx2["smart_turn"]
        )
        report["smart_turn (shipped int8, as ORT fuses it)"] = _prob_drift(
            native["smart_turn_fused_int8"], avx2["smart_turn_fused_int8"]
        )
    if "silero_vad" in native:
        va, vb = native["silero_vad"], avx2["silero_vad"]
        diffs = np.concatenate([np.abs(np.subtract(va[k], vb[k])) for k in va])
        flips = sum(
            int(np.sum((np.asarray(va[k]) >= 0.5) != (np.asarray(vb[k]) >= 0.5))) for k in va
        )
        report["silero_vad"] = {
            "windows": int(diffs.size),
            "max_abs_diff": round(float(diffs.max()), 6),
            "mean_abs_diff": round(float(diffs.mean()), 8),
            "speech_decisions_flipped": flips,
        }
    if "moonshine" in native:
        ma, mb = native["moonshine"], avx2["moonshine"]
        report["moonshine"] = {
            "clips": len(ma),
            "identical_tokens": sum(ma[k] == mb[k] for k in ma),
            "differing": {
                k: {"native": native["moonshine_text"][k], "avx2": avx2["moonshine_text"][k]}
                for k in ma
                if ma[k] != mb[k]
            },
        }
    if "piper" in native:
        piper: dict[str, Any] = {}
        for s, a_list in native["piper"].items():
            a, b = np.asarray(a_list), np.asarray(avx2["piper"][s])
            n = min(a.size, b.size)
            err = float(np.sqrt(np.mean((a[:n] - b[:n]) ** 2)))
            ref = float(np.sqrt(np.mean(a[:n] ** 2)))
            piper[s] = {
                "samples": [int(a.size), int(b.size)],
                "max_abs_diff": round(float(np.max(np.abs(a[:n] - b[:n]))), 6),
                "diff_db_re_speech": round(20 * np.log10(max(err, 1e-12) / ref), 1),
            }
        report["piper"] = piper
    return report


def _cpu_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next(
        (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
    )
    return sorted(f for f in flags if f.startswith(("avx", "amx")))


def _run_all(args: argparse.Namespace, qemu: str, work: Path) -> dict[str, dict[str, Any]]:
    """Each model natively, then under qemu (models in parallel there: ``--jobs``); a
    model whose result is already in ``work`` is not run again (``--work`` resumes)."""
    inputs = work / "inputs.npz"
    if not inputs.exists():
        arrays: dict[str, Any] = {
            k: np.array(v, dtype=object) for k, v in prepare(args.quick).items()
        }
        np.savez(inputs, **arrays)
    jobs: list[tuple[str, list[str], Path]] = []
    for label, prefix in (("native", []), ("avx2", [qemu, "-cpu", args.cpu])):
        for model in args.models:
            out = work / f"{label}-{model}.json"
            if not out.exists():
                cmd = [*prefix, sys.executable, __file__, "--worker", model, str(inputs), str(out)]
                jobs.append((label, cmd, out))
    running: list[tuple[subprocess.Popen[bytes], Path]] = []
    while jobs or running:
        while jobs and len(running) < args.jobs:
            label, cmd, out = jobs.pop(0)
            print(f"{label}: {cmd[-3]}", flush=True)
            err = subprocess.DEVNULL if label == "avx2" else None
            running.append((subprocess.Popen(cmd, stderr=err), out))
        proc, out = running.pop(0)
        if proc.wait() != 0:
            raise SystemExit(f"{out.stem} failed ({proc.returncode})")
    runs: dict[str, dict[str, Any]] = {"native": {}, "avx2": {}}
    for label, run in runs.items():
        for model in args.models:
            run.update(json.loads((work / f"{label}-{model}.json").read_text()))
            run.setdefault("seconds_by_model", {})[model] = run.pop("seconds")
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer windows and clips")
    ap.add_argument("--cpu", default="Haswell", help="qemu CPU model of the other path")
    ap.add_argument("--out", type=Path, default=OUT / "kernel_drift.json")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--jobs", type=int, default=2, help="processes at once")
    ap.add_argument("--work", type=Path, help="keep (and resume from) per-model results here")
    ap.add_argument("--worker", nargs=3, metavar=("MODEL", "INPUTS", "OUTPUT"))
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker[0], Path(args.worker[1]), Path(args.worker[2]))
        return 0
    qemu = shutil.which("qemu-x86_64")
    if qemu is None or platform.machine() != "x86_64":
        print("needs qemu-x86_64 (Debian: apt-get install qemu-user) on x86-64", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        runs = _run_all(args, qemu, work)
    result = {
        "native_cpu_flags": _cpu_flags(),
        "emulated_cpu": f"qemu-x86_64 -cpu {args.cpu}",
        "threshold": THRESHOLD,
        "drift": compare(runs["native"], runs["avx2"]),
        "seconds_by_model": {k: r["seconds_by_model"] for k, r in runs.items()},
    }
    if "smart_turn" in runs["native"]:
        result["smart_turn_graph"] = {k: r["graph"] for k, r in runs.items()}
        result["smart_turn"] = {
            k: {"native": round(v, 4), "avx2": round(runs["avx2"]["smart_turn"][k], 4)}
            for k, v in runs["native"]["smart_turn"].items()
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["drift"], indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
