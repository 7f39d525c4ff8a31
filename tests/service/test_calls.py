"""The channel's calls, declared once (``naiad/service/calls.py``): each declaration's argument record is the face
method's parameters, in order and with their defaults; each has a method on the front end's face and a handler on
the host; arguments and answers cross marshal and come back as the face takes and returns them; and the front
end's method sends exactly the declared record."""

from __future__ import annotations

import asyncio
import inspect
import marshal
from typing import Any

import pytest

from naiad.config import ModelConfig
from naiad.repository.consent import CodeConsent
from naiad.service import calls
from naiad.service.face import Service
from naiad.service.hosting import _OWN, Link
from naiad.service.remote import RemoteService

DECLARED = list(calls.CALLS.values())

# Sample arguments for each call, as a front end passes them (positionally).
SAMPLES: dict[str, tuple] = {
    "model": ("m", "1"),
    "model_metadata": ("m",),
    "model_config": ("m", "2"),
    "model_config_message": ("m", ""),
    "model_statistics": (),
    "repository_index": (True,),
    "load_model": ("m", '{"backend": "python"}', {"1/model.py": b"x"}, CodeConsent(True, "secret")),
    "unload_model": ("m", True),
    "sagemaker_models": (),
    "sagemaker_model": ("key",),
    "sagemaker_load": ("key", "/opt/ml/models/key/model", "key"),
    "sagemaker_unload": ("key",),
    "sagemaker_ensure": ("target.tar.gz",),
    "shm_register": ("r", "/key", 0, 64),
    "shm_unregister": ("r",),
    "shm_unregister_all": (),
    "shm_status": ("r",),
    "shm_cuda_status": (),
    "shm_cuda_register": ("r",),
    "trace_settings": ("m",),
    "update_trace_settings": ("m", {"trace_rate": "10"}),
    "log_settings_values": (),
    "update_log_settings": ({"log_info": False},),
    "dashboard_feed": ("http",),
}


def test_every_call_has_a_sample() -> None:
    assert set(SAMPLES) == set(calls.CALLS)


@pytest.mark.parametrize("call", DECLARED, ids=lambda c: c.name)
def test_the_record_is_the_face_methods_parameters(call: calls.Call) -> None:
    parameters = list(inspect.signature(getattr(Service, call.name)).parameters.values())[1:]
    assert tuple(p.name for p in parameters) == call.args._fields
    defaults = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
    assert defaults == call.args._field_defaults


@pytest.mark.parametrize("call", DECLARED, ids=lambda c: c.name)
def test_both_ends_have_it(call: calls.Call) -> None:
    assert callable(getattr(RemoteService, call.name))  # the front end's face
    own = _OWN.get(call.name)
    handler = getattr(Link, own) if own is not None else getattr(Service, call.name)  # the host's dispatch
    parameters = list(inspect.signature(handler).parameters)[1:]
    assert tuple(parameters) == call.args._fields  # a handler of the link's own takes the same record


def test_calls_the_link_answers_itself_are_declared() -> None:
    assert set(_OWN) <= set(calls.CALLS)


@pytest.mark.parametrize("call", DECLARED, ids=lambda c: c.name)
def test_arguments_cross_marshal_as_the_face_takes_them(call: calls.Call) -> None:
    sample = SAMPLES[call.name]
    sent = call.send(tuple(call.args(*sample)))
    received = call.receive(marshal.loads(marshal.dumps(sent)))
    expected = sample + tuple(call.args._field_defaults[f] for f in call.args._fields[len(sample):])
    assert tuple(map(_comparable, received)) == tuple(map(_comparable, expected))
    if call is calls.LOAD_MODEL:
        assert type(received[3]) is CodeConsent  # the face's own type again, on the host


def _comparable(value: Any) -> Any:
    return (value.keyed, value.restrict) if isinstance(value, CodeConsent) else value


def test_answers_cross_marshal() -> None:
    config = ModelConfig(name="m", max_batch_size=8)
    back = calls.CONFIG.unpack(marshal.loads(marshal.dumps(calls.CONFIG.pack(config))))
    assert isinstance(back, ModelConfig) and back == config
    plain = {"model_stats": [{"name": "m", "version": "1", "inference_count": 3}]}
    assert calls.PLAIN.unpack(marshal.loads(marshal.dumps(calls.PLAIN.pack(plain)))) == plain
    assert {c.answer.kind for c in DECLARED} == {"none", "plain", "config", "view"}


def test_changes_and_deadlines() -> None:
    changing = {c.name for c in DECLARED if c.changes}
    assert changing == {"load_model", "unload_model", "sagemaker_load", "sagemaker_unload", "sagemaker_ensure"}
    assert all(c.seconds == calls.CHANGE_SECONDS for c in DECLARED if c.changes)
    assert all(c.seconds == calls.CALL_SECONDS for c in DECLARED if not c.changes)


def test_a_built_method_sends_the_record_and_returns_the_unpacked_answer() -> None:
    sent: list[tuple[calls.Call, tuple]] = []

    class Face:
        async def call(self, call: calls.Call, args: tuple) -> Any:
            sent.append((call, args))
            return ModelConfig(name="m").SerializeToString() if call is calls.MODEL_CONFIG_MESSAGE else None

    face = Face()
    config = asyncio.run(calls.MODEL_CONFIG_MESSAGE.remote()(face, "m"))
    assert isinstance(config, ModelConfig) and config.name == "m"
    asyncio.run(calls.LOAD_MODEL.remote()(face, "m", consent=CodeConsent(False, "k")))
    assert sent == [(calls.MODEL_CONFIG_MESSAGE, ("m", "")), (calls.LOAD_MODEL, ("m", None, None, (False, "k")))]
    with pytest.raises(TypeError):
        asyncio.run(calls.UNLOAD_MODEL.remote()(face, "m", True, "extra"))
