"""The voice agent's knobs, in a module of their own so that reading a config file does not
load onnxruntime (``sip-bridge status`` and ``--help`` stay instant)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ASR_WEIGHTS", "DEVICES", "ModelSettings", "VoiceSettings"]

DEVICES = ("auto", "cuda", "cpu")
#: Moonshine's decoder as shipped (float) or with 8-bit matrix weights (about half the CPU
#: per token; model_runtime.int8_matmuls). A GPU always runs the float one.
ASR_WEIGHTS = ("float", "int8")


@dataclass(frozen=True)
class VoiceSettings:
    """Turn-taking: [agent.voice] in bridge.toml (barge-in: the profile's [barge_in])."""

    barge_in: bool = True  # set from the agent profile's [barge_in]
    barge_in_ms: int = 200  # caller speech over our reply for this long cuts the reply
    echo_canceller: bool = True  # take our line echo out, decide barge-in on what is left
    echo_margin_db: float = 6.0  # the caller must beat the echo left (of what an echo
    # could be, without the canceller: our voice 6 dB down, G.168's minimum return loss)
    turn_threshold: float = 0.5  # smart-turn probability that ends a turn at a pause
    pause_ms: int = 200  # silence after speech before smart-turn is asked
    max_silence_ms: int = 900  # silence after speech that ends a turn whatever the model says
    min_speech_ms: int = 120  # speech shorter than this is a click or a cough: not a turn
    speculate: bool = True  # prepare the reply during the pause (agent.speculation)


#: Languages the shipped speech models hear and speak: Moonshine base-en (ASR) and Piper's
#: en_US "joe" voice (TTS). A profile in another language needs other models.
SPEECH_LANGUAGES = ("en",)


@dataclass(frozen=True)
class ModelSettings:
    """[models] in bridge.toml."""

    dir: str = ""  # model store; empty: $SIP_BRIDGE_MODELS, else ~/.cache/sip-bridge/models
    device: str = "auto"  # auto | cuda | cpu
    threads: int = 1  # inference threads of each ASR, end-of-turn and TTS run (x workers)
    workers: int = 2  # model jobs (ASR segments, TTS sentences) running at once
    batch_vad: bool = True  # one VAD inference per tick for all calls
    phrase_cache_mb: int = 32  # rendered speech kept for reuse (agent.voice.phrase_cache); 0: off
    nice: int = 10  # model threads this much nicer than the media loop's: its frames go first
    asr_weights: str = "int8"  # int8 | float: the ASR decoder's weights (ASR_WEIGHTS)
