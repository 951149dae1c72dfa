"""How the Generate button's event looks to the page and to gradio_client (the ``/generate`` endpoint).

One parameter per request field, in :data:`form.FIELDS` order, and file fields that take uploads only.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import gradio as gr

from ..errors import InputError
from . import form as F

def uploads_only(component: gr.File, field: str) -> gr.File:
    """Refuse a file value that is not an upload (e.g. a raw server path) in the project's words.

    Gradio validates a File input's payload against its data model before any handler runs,
    also with ``preprocess=False``; its own refusal reaches the client as no message at all.
    """
    base = component.data_model

    class UploadedFile(base):  # type: ignore[misc, valid-type]
        @classmethod
        def model_validate(cls, obj, *args, **kwargs):
            if not isinstance(obj, dict) or not isinstance(obj.get("path"), str):
                raise gr.Error(str(InputError(field, "is not an uploaded file",
                                              "upload it (gradio_client: handle_file(path)); a server path "
                                              "or plain text is not accepted")), print_exception=False)
            return base.model_validate(obj, *args, **kwargs)

    component.data_model = UploadedFile
    return component


def one_parameter_per_field(fn: Callable[[dict[str, Any], gr.Request], Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """``fn(form_values, request)`` as Gradio calls an event: one parameter per :data:`form.FIELDS` name
    (the /generate endpoint's parameter names), then ``request``; so the signature follows the request model.

    Each parameter defaults to None, which Gradio's API info reads as optional where the component has
    no initial value (the files, the negative prompt): ``predict(prompt=..., api_name="/generate")`` works."""
    parameters = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None) for name in F.FIELDS]
    signature = inspect.Signature([*parameters, inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                                  default=None, annotation=gr.Request)])

    def event(*args: Any, **kwargs: Any) -> Iterator[Any]:
        bound = signature.bind(*args, **kwargs).arguments
        yield from fn({name: bound[name] for name in F.FIELDS}, bound["request"])

    event.__signature__ = signature  # type: ignore[attr-defined]
    event.__annotations__ = {"request": gr.Request}
    event.__doc__, event.__name__ = fn.__doc__, fn.__name__
    return event
