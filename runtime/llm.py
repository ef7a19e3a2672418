"""The ``Model`` interface behind model-turn steps, and its two implementations.

A model turn is replayable computation: its inputs (prompt id, accepted
facts) and its identity (model id) are recorded, its answer is advisory data
the workflow validates, and a failure is transient (the task waits and
retries) — never a reason to repeat a side effect.

Model output is outside data. ``accepted`` is the one gate between a reply
and the task's facts: text trimmed and bounded, and refused
(``ModelOutputInvalid``) when it, or the model id the endpoint reported,
cannot be stored (``tasks.values``). Refused rather than cleaned: answers
route the workflow by exact text, and a corrupted answer quietly repaired
into a route ("ref<NUL>und" -> "refund") would act on output the model never
gave cleanly. The step retries the turn later, like any transient failure.

The endpoint's key (``MODEL_API_KEY``) travels as a bearer header, never in
``MODEL_URL`` (a URL with user-info is refused). A failure's message becomes a
task's audit reason, so it is redacted (``audit.redaction``) before it leaves here.

Each turn is a span following the OpenTelemetry GenAI conventions (``chat <model>``:
the operation, the model asked and the one that answered, the tokens when the endpoint
counts them). Never the instructions, the facts or the answer: spans leave the process.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Protocol

import httpx
from django.conf import settings
from django.core.signals import setting_changed
from opentelemetry import trace

from audit.redaction import redact
from config.external import has_userinfo
from tasks import registry, values
from tasks.checkpoints import MAX_FACT_LENGTH

tracer = trace.get_tracer(__name__)


class ModelUnavailable(Exception):
    """The model could not answer now (timeout, HTTP error, garbled reply): retry later."""


class ModelTimedOut(ModelUnavailable):
    """The turn took longer than its step allows: retried later as a timeout, not a failure."""


class TurnCanceled(Exception):
    """A cancel request reached the task while its turn was in flight: the answer is not used."""


# Set by the worker for the task a thread runs (``runtime.runner``): an event a cancel request sets
# (``runtime.heartbeats``), and the step's own limit. A model that can stop early waits on the event;
# any other's answer is thrown away when the event was set meanwhile (``_model_turn``).
cancel_signal: ContextVar[threading.Event | None] = ContextVar("cancel_signal", default=None)
turn_timeout: ContextVar[float | None] = ContextVar("turn_timeout", default=None)


@contextmanager
def limits(timeout: float | None) -> Iterator[None]:
    """Run a turn under the step's ``timeout`` (seconds; None: the model's own)."""
    token = turn_timeout.set(timeout)
    try:
        yield
    finally:
        turn_timeout.reset(token)


def _canceled() -> bool:
    signal = cancel_signal.get()
    return signal is not None and signal.is_set()


def _wait(seconds: float) -> None:
    """Spend a turn's ``seconds`` as a model would, stopping early for a cancel or the step's timeout."""
    limit = turn_timeout.get()
    spend = seconds if limit is None else min(seconds, limit)
    signal = cancel_signal.get()
    if signal is not None and signal.wait(spend):
        raise TurnCanceled("a cancel request interrupted the model turn")
    if signal is None:
        time.sleep(spend)
    if limit is not None and seconds > limit:
        raise ModelTimedOut(f"model turn timed out after {limit:g} s")


class ModelOutputInvalid(Exception):
    """The model answered with text the task cannot store: refused, the turn is retried later."""


@dataclass(frozen=True)
class Reply:
    text: str
    model_id: str
    # As the endpoint counted them, when it does. Metering, not the answer: two replies saying the
    # same thing from the same model are equal whatever they cost.
    input_tokens: int | None = field(default=None, compare=False)
    output_tokens: int | None = field(default=None, compare=False)


def accepted(reply: Reply) -> Reply:
    """``reply`` as the task may keep it: text trimmed and bounded, both fields storable.

    Raises ``ModelOutputInvalid`` naming what was refused (never quoting it).
    """
    text = reply.text.strip()[:MAX_FACT_LENGTH]
    for where, value in (("answer", text), ("model id", reply.model_id)):
        problem = values.text_problem(value)
        if problem:
            raise ModelOutputInvalid(f"model output refused: the {where} {problem}")
    return Reply(text, reply.model_id, reply.input_tokens, reply.output_tokens)


class Model(Protocol):
    model_id: str

    def complete(self, *, prompt_id: str, system: str, facts: Mapping[str, Any]) -> Reply: ...


Script = Callable[[Mapping[str, Any]], str]
Complete = Callable[..., Reply]


def _model_turn(provider: str) -> Callable[[Complete], Complete]:
    """Wrap a ``complete`` method in its GenAI span (see the module's docstring)."""

    def wrap(complete: Complete) -> Complete:
        @functools.wraps(complete)
        def traced(self: Any, *, prompt_id: str, system: str, facts: Mapping[str, Any]) -> Reply:
            requested = getattr(self, "model", "") or self.model_id
            attributes = {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": provider,
                "gen_ai.request.model": requested,
                "durable.prompt_id": prompt_id,
            }
            with tracer.start_as_current_span(
                f"chat {requested}", kind=trace.SpanKind.CLIENT, attributes=attributes
            ) as span:
                try:
                    if _canceled():
                        raise TurnCanceled("a cancel request came before the model turn started")
                    reply = complete(self, prompt_id=prompt_id, system=system, facts=facts)
                    if _canceled():  # a model that cannot stop early: its answer comes too late
                        raise TurnCanceled("a cancel request came while the model was answering")
                except Exception as exc:
                    span.set_attribute("error.type", type(exc).__name__)
                    raise
                if span.is_recording():
                    span.set_attribute("gen_ai.response.model", reply.model_id)
                    if reply.input_tokens is not None:
                        span.set_attribute("gen_ai.usage.input_tokens", reply.input_tokens)
                    if reply.output_tokens is not None:
                        span.set_attribute("gen_ai.usage.output_tokens", reply.output_tokens)
                return reply

        return traced

    return wrap


class ScriptedModel:
    """Deterministic answers per prompt id (each workflow's ``scripts``): the demo's and the tests' model.

    It counts tokens too (``_scripted_tokens``: what it was sent, what it answered), so usage and cost
    figures show without an endpoint."""

    model_id = "scripted-v1"

    def __init__(self, scripts: Mapping[str, Script] | None = None, *, latency: float = 0.0):
        # None: the registry's scripts, read at each turn, so a task type registered after this model
        # was made (the process's model is made once) is answered too.
        self._scripts = None if scripts is None else dict(scripts)
        self.latency = latency  # seconds each answer takes, like a real model's turn

    @_model_turn("scripted")
    def complete(self, *, prompt_id: str, system: str, facts: Mapping[str, Any]) -> Reply:
        script = (registry.scripts() if self._scripts is None else self._scripts).get(prompt_id)
        if script is None:
            raise ModelUnavailable(f"scripted model has no script for prompt {prompt_id!r}")
        if self.latency:
            _wait(self.latency)
        shown = registry.facts_for_model(prompt_id, facts)
        answer = script(shown)
        return Reply(
            answer,
            self.model_id,
            input_tokens=_scripted_tokens(system + json.dumps(shown, sort_keys=True, default=str)),
            output_tokens=_scripted_tokens(answer),
        )


def _scripted_tokens(text: str) -> int:
    """The scripted model's token count: one per four characters, rounded up, as a rough tokenizer
    would give; deterministic, so the demo and the tests show the same figures every run."""
    return max(1, -(-len(text) // 4))


class OpenAICompatibleModel:
    """Any endpoint speaking the OpenAI chat-completions protocol."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str = "",
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ):
        if has_userinfo(base_url):
            raise ValueError("the model URL holds a user name or password: pass the key as api_key instead")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.model_id = f"openai-compatible:{model}"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(timeout=timeout, headers=headers, transport=transport)

    @_model_turn("openai")
    def complete(self, *, prompt_id: str, system: str, facts: Mapping[str, Any]) -> Reply:
        body = {
            "model": self.model,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": system},
                {
                    "role": "user",
                    # Sensitive facts masked unless the task type says the model needs them.
                    "content": json.dumps(
                        registry.facts_for_model(prompt_id, facts), sort_keys=True, default=str
                    ),
                },
            ],
            "metadata": {"prompt_id": prompt_id},
        }
        limit = turn_timeout.get()
        try:
            response = self.client.post(
                f"{self.base_url}/chat/completions",
                json=body,
                timeout=limit if limit is not None else httpx.USE_CLIENT_DEFAULT,
            )
            response.raise_for_status()
            payload = response.json()
            text = payload["choices"][0]["message"]["content"]
        except httpx.TimeoutException as exc:
            raise ModelTimedOut(redact(values.printable(f"model timed out: {exc}"))) from None
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            failure = f"model call failed: {type(exc).__name__}: {exc}"
            raise ModelUnavailable(redact(values.printable(failure))) from None
        if not isinstance(text, str):
            raise ModelUnavailable("model reply has no text content")
        usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
        return Reply(
            text.strip(),
            f"openai-compatible:{payload.get('model', self.model)}",
            input_tokens=_count(usage.get("prompt_tokens")),
            output_tokens=_count(usage.get("completion_tokens")),
        )


def _count(value: Any) -> int | None:
    """A token count as reported, or None when the endpoint reported none (or nonsense)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@cache
def default_model() -> Model:
    """The process's model (one per process, so an HTTP model keeps its connections)."""
    if settings.MODEL_BACKEND == "openai":
        return OpenAICompatibleModel(
            base_url=settings.MODEL_URL,
            model=settings.MODEL_NAME,
            api_key=settings.MODEL_API_KEY,
            timeout=settings.MODEL_TIMEOUT,
        )
    return ScriptedModel(latency=settings.MODEL_LATENCY_MS / 1000)


def _forget(setting: str, **_: Any) -> None:
    """A changed ``MODEL_*`` setting (a test's, or ``override_settings``) is the next model's: the
    process's cached one was built from the old values."""
    if setting.startswith("MODEL_"):
        default_model.cache_clear()


setting_changed.connect(_forget, dispatch_uid="runtime.llm.forget")
