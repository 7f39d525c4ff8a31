"""The channel's calls (``wire.CALL`` / ``wire.REPLY``), each declared once: its name (the face method it stands for),
the record of its arguments, what its answer is on the wire, whether it changes which versions serve, and how long
a front end waits for it. Both ends are built from these declarations and nothing else: the front end's face
method (``Call.remote``, in ``remote.RemoteService``) and the host's dispatch (``hosting.Link``: a handler of its
own where the call needs the host's state, else the face method of the same name).

A call's arguments cross as the record's tuple, its answer as the declared ``Answer`` packs it: plain values that
marshal carries. ``infer`` and ``stream`` have their own messages (``wire.Request`` / ``wire.Result``), and what a
front end answers at once comes with the pushed ``wire.State``; nothing else is callable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Coroutine, NamedTuple

from naiad.config import ModelConfig
from naiad.repository.consent import CodeConsent

CALL_SECONDS = 60.0  # how long a call waits for the host's answer
CHANGE_SECONDS = 600.0  # ... a load or an unload (a model may take long to initialize; a download, longer)


# --- answers: what a call's value is on the wire ------------------------------------------------------------------

def _same(value: Any) -> Any:
    return value


def _config_bytes(config: ModelConfig) -> bytes:
    return config.SerializeToString()


def _config_message(data: bytes) -> ModelConfig:
    config = ModelConfig()
    config.ParseFromString(data)
    return config


@dataclass(frozen=True)
class Answer:
    """A call's answer: ``kind`` names what it is (the schema test round-trips a sample of each); ``pack`` makes the
    face's value plain on the host, ``unpack`` makes it the face's value again on the front end."""

    kind: str
    pack: Callable[[Any], Any] = _same
    unpack: Callable[[Any], Any] = _same


NOTHING = Answer("none")
PLAIN = Answer("plain")  # dicts, lists, strings and numbers, as the face returns them
CONFIG = Answer("config", _config_bytes, _config_message)
# A model's view (``wire.View``): made by the host's link, which numbers it, and kept by the front end's face,
# which builds its check from it; both ends handle it themselves.
VIEW = Answer("view")


# --- arguments: one record per call, the face method's parameters in order ---------------------------------------

class Model(NamedTuple):
    name: str
    version: str = ""


class Statistics(NamedTuple):
    name: str = ""
    version: str = ""


class Index(NamedTuple):
    ready_only: bool = False


class Load(NamedTuple):
    name: str
    config: str | None = None
    files: dict[str, bytes] | None = None
    consent: Any = None  # a CodeConsent on either end; (keyed, restrict) on the wire


class Unload(NamedTuple):
    name: str
    unload_dependents: bool = False


class Nothing(NamedTuple):
    pass


class Key(NamedTuple):
    key: str


class SageMakerLoad(NamedTuple):
    key: str
    url: str
    target: str


class Target(NamedTuple):
    target: str


class Region(NamedTuple):
    name: str
    key: str
    offset: int
    byte_size: int


class Name(NamedTuple):
    name: str


class MaybeName(NamedTuple):
    name: str = ""


class TraceModel(NamedTuple):
    model: str = ""


class TraceUpdate(NamedTuple):
    model: str
    changes: dict[str, Any]


class Changes(NamedTuple):
    changes: dict[str, Any]


class Port(NamedTuple):
    port: str


def _consent_out(args: tuple) -> tuple:
    consent = args[3]
    return args if consent is None else (*args[:3], (consent.keyed, consent.restrict))


def _consent_in(args: tuple) -> tuple:
    consent = args[3]
    return args if consent is None else (*args[:3], CodeConsent(*consent))


@dataclass(frozen=True)
class Call:
    name: str  # the face method's, and the call's on the wire
    args: type  # the record of its arguments (a NamedTuple)
    answer: Answer = PLAIN
    changes: bool = False  # changes which versions serve: every front end forgets its views before the answer
    seconds: float = CALL_SECONDS  # how long a front end waits for the answer
    send: Callable[[tuple], tuple] = _same  # the arguments as marshal carries them (front end) ...
    receive: Callable[[tuple], tuple] = _same  # ... and as the face takes them again (host)

    def remote(self) -> Callable[..., Coroutine[Any, Any, Any]]:
        """The front end's face method for this call: its arguments as the record takes them, sent; the answer, as
        the face returns it, or the host's error raised (``RemoteService.call``)."""
        record, call = self.args, self

        async def method(face: Any, *args: Any, **kwargs: Any) -> Any:
            return call.answer.unpack(await face.call(call, call.send(tuple(record(*args, **kwargs)))))

        method.__name__ = method.__qualname__ = self.name
        return method


MODEL = Call("model", Model, VIEW)
MODEL_METADATA = Call("model_metadata", Model)
MODEL_CONFIG = Call("model_config", Model)
MODEL_CONFIG_MESSAGE = Call("model_config_message", Model, CONFIG)
MODEL_STATISTICS = Call("model_statistics", Statistics)
REPOSITORY_INDEX = Call("repository_index", Index)
LOAD_MODEL = Call("load_model", Load, NOTHING, True, CHANGE_SECONDS, _consent_out, _consent_in)
UNLOAD_MODEL = Call("unload_model", Unload, NOTHING, True, CHANGE_SECONDS)
SAGEMAKER_MODELS = Call("sagemaker_models", Nothing)
SAGEMAKER_MODEL = Call("sagemaker_model", Key)
SAGEMAKER_LOAD = Call("sagemaker_load", SageMakerLoad, NOTHING, True, CHANGE_SECONDS)
SAGEMAKER_UNLOAD = Call("sagemaker_unload", Key, NOTHING, True, CHANGE_SECONDS)
# The target's view: the request that follows needs no other call, in which an eviction could come.
SAGEMAKER_ENSURE = Call("sagemaker_ensure", Target, VIEW, True, CHANGE_SECONDS)
SHM_REGISTER = Call("shm_register", Region, NOTHING)
SHM_UNREGISTER = Call("shm_unregister", Name, NOTHING)
SHM_UNREGISTER_ALL = Call("shm_unregister_all", Nothing, NOTHING)
SHM_STATUS = Call("shm_status", MaybeName)
SHM_CUDA_STATUS = Call("shm_cuda_status", MaybeName)
SHM_CUDA_REGISTER = Call("shm_cuda_register", Name, NOTHING)
TRACE_SETTINGS = Call("trace_settings", TraceModel)
UPDATE_TRACE_SETTINGS = Call("update_trace_settings", TraceUpdate, NOTHING)
LOG_SETTINGS_VALUES = Call("log_settings_values", Nothing)
UPDATE_LOG_SETTINGS = Call("update_log_settings", Changes, NOTHING)
DASHBOARD_FEED = Call("dashboard_feed", Port)

CALLS: dict[str, Call] = {call.name: call for call in (
    MODEL, MODEL_METADATA, MODEL_CONFIG, MODEL_CONFIG_MESSAGE, MODEL_STATISTICS, REPOSITORY_INDEX, LOAD_MODEL,
    UNLOAD_MODEL, SAGEMAKER_MODELS, SAGEMAKER_MODEL, SAGEMAKER_LOAD, SAGEMAKER_UNLOAD, SAGEMAKER_ENSURE,
    SHM_REGISTER, SHM_UNREGISTER, SHM_UNREGISTER_ALL, SHM_STATUS, SHM_CUDA_STATUS, SHM_CUDA_REGISTER,
    TRACE_SETTINGS, UPDATE_TRACE_SETTINGS, LOG_SETTINGS_VALUES, UPDATE_LOG_SETTINGS, DASHBOARD_FEED)}
