"""Which agent answers a call, from config: the line-check agents, or the voice agent whose
models are loaded and warmed once per process (before the first call, not during it); and,
when a call's agent reports a model fault, the fallback prompt that takes its place."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, cast

import numpy as np
from numpy.typing import NDArray

from agent.base import Agent, AgentOutput, CallInfo
from agent.lines.echo import EchoAgent
from agent.lines.fallback_prompt import FallbackPromptAgent
from agent.lines.playback import PlaybackAgent, load_wav
from agent.lines.tone import ToneAgent
from sip_bridge.config.loader import BridgeConfig, SpeechModelConfig

if TYPE_CHECKING:
    from agent.dialogue.profile import AgentProfile
    from agent.speech_to_speech import FrameBatcher
    from agent.voice.voice_models import VoiceModels
    from model_runtime.sessions import Device
    from model_runtime.speech_to_speech import SpeechToSpeechModel
    from sip_bridge.config.config_types import AgentConfig

__all__ = [
    "fallback_prompt",
    "load_agent_models",
    "make_agent",
    "prepare_agents",
    "profile_name",
    "take_over",
]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_models: dict[object, VoiceModels] = {}
_profiles: dict[tuple[str, int], AgentProfile] = {}  # (path, mtime): an edit loads anew
_speech: dict[SpeechModelConfig, tuple[SpeechToSpeechModel, FrameBatcher | None]] = {}
_prompts: dict[tuple[str, int], NDArray[np.int16]] = {}
_warmed: set[tuple[int, int, int]] = set()  # (models, profile, bound) whose phrases were queued


def make_agent(config: BridgeConfig) -> Agent:
    """The configured agent for a new call."""
    a = config.agent
    if a.name == "echo":
        # at the line rate: an echo needs no resampling (and a line check hears the line
        # bit-exact, G.711 in and out); 24 kHz models resample in the media chain
        return EchoAgent(delay_s=a.echo_delay_s, sample_rate=8000)
    if a.name == "tone":
        return ToneAgent(freq_hz=a.tone_freq_hz, level_dbfs=a.tone_level_dbfs)
    if a.name == "playback":
        return PlaybackAgent(
            a.playback_file, loop=a.playback_loop, hangup_at_end=a.playback_hangup_at_end
        )
    if a.name == "voice":
        from agent.voice.voice_agent import VoiceAgent

        models, profile = prepare_agents(config)
        hours = profile.hours
        if hours is not None and not hours.is_open(datetime.now(UTC)):
            profile = _profile(hours.after_hours_profile)  # loaded at start: cached
        hold = profile.transfer.hold_audio or config.transfer.hold_audio
        return VoiceAgent(
            models, profile, a.voice, model_timeout_s=a.model_timeout_s,
            hold_audio=_hold_audio(hold) if hold else None,
        )  # fmt: skip
    if a.name == "speech_model":
        from agent.speech_to_speech import SpeechToSpeechAgent

        model, batcher = _speech_model(config)
        return SpeechToSpeechAgent(model, batcher=batcher)
    raise ValueError(f"unknown agent {a.name!r}")


def _speech_model(config: BridgeConfig) -> tuple[SpeechToSpeechModel, FrameBatcher | None]:
    """The user's speech-to-speech model, loaded once; with a batch axis, one run per tick
    serves every call (the batcher is made on the bridge's loop, at the first call)."""
    from model_runtime.batching import TickBatcher
    from model_runtime.speech_to_speech import SpeechModelSpec, SpeechToSpeechModel
    from model_runtime.store import ModelError

    sm = config.agent.speech_model
    assert sm is not None  # the config checks it
    m = config.models
    with _lock:
        entry = _speech.get(sm)
        if entry is None:
            spec = SpeechModelSpec(
                Path(sm.path), sm.input, sm.output, sm.sample_rate, sm.frame_samples,
                sm.state, sm.batch,
            )  # fmt: skip
            try:
                model = SpeechToSpeechModel(
                    spec, threads=m.threads, device=cast("Device", m.device)
                )
            except (ValueError, FileNotFoundError) as exc:  # names or shapes that do not fit
                raise ModelError(f"agent.speech_model: {exc}") from None
            batcher = TickBatcher(model.run_batch) if sm.batch else None
            entry = _speech[sm] = (model, batcher)
    return entry


def profile_name(agent: Agent) -> str:
    """The name of the profile a voice agent answers with (``[agent] name``, else its file's
    stem; the after-hours one out of hours); "" for other agents."""
    from agent.dialogue.profile import AgentProfile

    profile = getattr(agent, "profile", None)
    return profile.name if isinstance(profile, AgentProfile) else ""


def fallback_prompt(a: AgentConfig, sample_rate: int) -> NDArray[np.int16]:
    """``[agent] fallback_prompt`` at ``sample_rate``, decoded once (empty: no prompt)."""
    if not a.fallback_prompt:
        return np.zeros(0, np.int16)
    key = (a.fallback_prompt, sample_rate)
    with _lock:
        pcm = _prompts.get(key)
        if pcm is None:
            pcm = _prompts[key] = load_wav(a.fallback_prompt, sample_rate)
            pcm.flags.writeable = False
    return pcm


def _hold_audio(path: str) -> NDArray[np.int16]:
    """A transfer's hold audio at the voice agent's 8 kHz, decoded once per file."""
    key = (path, -8000)  # beside the fallback prompts, in their cache
    with _lock:
        pcm = _prompts.get(key)
        if pcm is None:
            pcm = _prompts[key] = load_wav(path, 8000)
            pcm.flags.writeable = False
    return pcm


class Leg(Protocol):
    """What :func:`take_over` needs of a call's leg: a SIP call's media, or a browser
    session (:class:`~sip_bridge.web.webrtc_leg.BrowserSession`)."""

    agent: Agent
    call: CallInfo

    @property
    def output(self) -> AgentOutput: ...


async def take_over(media: Leg, a: AgentConfig) -> None:
    """A model fault: silence the failed agent (its queued audio is dropped, and again what
    it wrote while stopping), stop it, and put the fallback prompt in its place, which then
    hangs up or transfers. The prompt agent answers at the failed one's rate, so the call's
    resamplers fit it."""
    old = media.agent
    media.output.flush()
    media.agent = silent = FallbackPromptAgent(np.zeros(0, np.int16), old.sample_rate)
    try:
        await old.stop()
    except Exception:  # it failed already; its stop must not keep the caller waiting
        log.exception("call %s: the failed agent %s did not stop cleanly", media.call.call_id,
                      old.name)  # fmt: skip
    # decoded once per rate, off the loop (a first decode designs a resampler's filter)
    loop = asyncio.get_running_loop()
    pcm = await loop.run_in_executor(None, fallback_prompt, a, old.sample_rate)
    action = cast(Literal["hangup", "transfer"], a.on_model_fault)
    prompt = FallbackPromptAgent(pcm, old.sample_rate, action=action,
                                 transfer_to=a.fault_transfer_to)  # fmt: skip
    if media.agent is not silent:  # replaced meanwhile: not ours to undo
        return
    media.output.flush()  # what the failed agent wrote while it stopped is not said either
    media.agent = prompt  # from the next tick on, the media talks to the prompt
    await prompt.start(media.call, media.output)


def load_agent_models(config: BridgeConfig) -> None:
    """Before the bridge listens: load (and warm) what the configured agent runs on, so a
    missing model or a model that does not fit its declaration stops the start in one line,
    and the first caller does not wait. Blocking: seconds on a cold start."""
    for rate in (8000, 16000, 24000):  # the fallback prompt: decoded before a call needs it
        fallback_prompt(config.agent, rate)
    if config.agent.name == "voice":
        _, profile = prepare_agents(config)  # and its transfer hold audio, decoded now
        for hold in (profile.transfer.hold_audio, config.transfer.hold_audio):
            if hold:
                _hold_audio(hold)
    elif config.agent.name == "speech_model":
        _speech_model(config)


def _profile(path: str) -> AgentProfile:
    """A profile, loaded once per version of its file (an edit loads it anew)."""
    from agent.dialogue.profile_loader import load_profile

    try:
        version = (path, Path(path).stat().st_mtime_ns)
    except OSError:
        version = (path, 0)  # load_profile says what is wrong with it
    profile = _profiles.get(version)
    if profile is None:
        profile = _profiles[version] = load_profile(Path(path))
    return profile


def prepare_agents(config: BridgeConfig) -> tuple[VoiceModels, AgentProfile]:
    """Load (once) the voice models and the profile; the first call loads and warms them, so
    `BridgeServer.start()` calls this before it listens. Blocking: seconds on a cold start."""
    from agent.voice.phrase_cache import shared_cache
    from agent.voice.voice_models import VoiceModels
    from model_runtime.store import default_store

    m = config.models
    with _lock:
        if m.dir:
            os.environ["SIP_BRIDGE_MODELS"] = m.dir  # before default_store() is first made
        profile = _profile(config.agent.voice_profile)
        if profile.hours is not None:  # a broken after-hours profile stops the start too
            _profile(profile.hours.after_hours_profile)
        scale = profile.voice.length_scale
        phrases = shared_cache(m.phrase_cache_mb << 20)
        key = (replace(m, phrase_cache_mb=0), default_store().root, scale)
        models = _models.get(key)
        if models is None:
            models = _models[key] = VoiceModels(m, length_scale=scale, phrases=phrases)
            models.warm_up()
        _warm_phrases(models, profile)
        if profile.hours is not None:  # its calls are answered with these models too
            _warm_phrases(models, _profile(profile.hours.after_hours_profile))
    return models, profile


def _warm_phrases(models: VoiceModels, profile: AgentProfile) -> None:
    """Queue ``profile``'s fixed phrases for rendering, once per models and profile version."""
    from agent.dialogue.fixed_phrases import fixed_pieces
    from agent.voice.voice_models import FIRST_WORDS

    key = (id(models), id(profile), models.phrases.max_bytes)  # a new bound may have dropped some
    if models.phrases.max_bytes == 0 or key in _warmed:
        return
    _warmed.add(key)
    models.warm_phrases(fixed_pieces(profile, first_max_words=FIRST_WORDS))
