"""The Generate form's values -> the engine's Plan (request and layout checked once), the same way for page and API.

Every refusal is the vocabulary's :class:`InputError` (the CLI's words); ``box_for`` says
which error line of the form shows it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..engines.base import Capabilities, Engine, Plan
from ..errors import InputError
from ..vocabulary.layouts import PRESETS, Layout, check_shape, parse_layout
from ..vocabulary.paths import inside
from ..vocabulary.request import Request, build_request_seeding, check_image, read_prompt_file, whole_number

CUSTOM = "custom"
ENGINE_DEFAULT = "engine default"

# The form's fields, in the order the generate event (page and API) takes them: the request
# model's fields (so a field added to Request reaches the page), then the layout's.
REQUEST_FIELDS: tuple[str, ...] = tuple(Request.model_fields)
LAYOUT_FIELDS = ("layout_preset", "sp", "cfg", "ep")
FIELDS = (*REQUEST_FIELDS, *LAYOUT_FIELDS)
# Optional whole numbers: number fields on the page (studio/number_field.py), blank meaning the engine's default.
OPTIONAL_WHOLE = tuple(name for name, info in Request.model_fields.items() if info.annotation == int | None)

# Which error line of the form shows a refusal of each field: the groups of the page, each line
# next to its fields; anything else shows under the button. The layout's line is its live verdict.
GROUPS: dict[str, tuple[str, ...]] = {
    "prompt": ("mode", "prompt", "prompt_file", "negative_prompt"),
    "image": ("image",),
    "sampling": ("seed", "steps", "refiner_steps", "preview_every"),
    "advanced": ("video_cfg", "audio_cfg", "compile", "deterministic", "output_width", "output_height"),
    "tier": ("tier",),
    "layout": ("layout", *LAYOUT_FIELDS),
}
BOXES = ("prompt", "image", "sampling", "advanced", "tier", "general")
_BOX_OF = {field: box for box, names in GROUPS.items() for field in names}


def box_for(field: str) -> str:
    return _BOX_OF.get(field.split(".")[0], "general")


def label(name: str) -> str:
    """A request field's label on the page: the model's title."""
    return Request.model_fields[name].title or name


def help_text(name: str) -> str | None:
    """A request field's help on the page: the model's description."""
    return Request.model_fields[name].description


def default(name: str) -> Any:
    return Request.model_fields[name].default


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _whole(value: Any, field: str) -> int | None:
    """Optional whole numbers arrive as text (blank: the engine's default) or, from the API, as numbers."""
    return None if _blank(value) else whole_number(value, field)


def layout_from_form(preset: str | None, sp: Any, cfg: Any, ep: Any) -> Layout:
    """A preset name, or the custom SP / CFG / EP fields, checked with the shared rules."""
    if not _blank(preset) and preset != CUSTOM:
        if not isinstance(preset, str) or preset not in PRESETS:
            raise InputError("layout", f"{preset!r} is not a preset", f"use one of {', '.join(PRESETS)} or custom")
        return parse_layout(preset)
    sp_value, cfg_value, ep_value = _whole(sp, "layout"), _whole(cfg, "layout"), _whole(ep, "layout")
    if sp_value is None or cfg_value is None:
        raise InputError("layout", "a custom layout needs SP and CFG", "fill in SP and CFG, or pick a preset")
    layout = Layout(sp_value, cfg_value, ep_value)
    check_shape(layout)
    return layout


def layout_to_form(layout: dict[str, Any]) -> tuple[str, int, int, int | None]:
    """The form's (preset, sp, cfg, ep) for a manifest's layout."""
    name = layout["name"]
    preset = name if name in PRESETS else CUSTOM
    return preset, layout["ulysses_degree"], layout["cfg_parallel_size"], layout["expert_parallel_size"]


def _to_form(name: str, value: Any) -> Any:
    """A manifest's request value as its form field holds it."""
    if name == "prompt_file":
        return None  # the prompt itself comes back; an upload cannot be refilled
    if name == "image":
        return value  # a file component takes a path or None, never ""
    if name == "compile":
        return value or ENGINE_DEFAULT
    return "" if value is None else value


def values_from_manifest(manifest: dict[str, Any]) -> list[Any]:
    """Form values (in :data:`FIELDS` order) that repeat a run: the replay path."""
    request = manifest["request"]
    values = {name: _to_form(name, request.get(name)) for name in REQUEST_FIELDS}
    preset, sp, cfg, ep = layout_to_form(manifest["layout"])
    values.update(layout_preset=preset, sp=sp, cfg=cfg, ep="" if ep is None else ep)
    return [values[name] for name in FIELDS]


def file_path(value: Any) -> str | None:
    """A Gradio file value (path string or FileData-like dict) as a path."""
    if _blank(value):
        return None
    if isinstance(value, dict):
        return value.get("path")
    return str(getattr(value, "path", value))


def upload_path(value: Any, field: str, uploads: Path | None) -> str | None:
    """A file the client uploaded: a FileData (or its path) inside the studio's upload folder.

    The /generate event takes raw payloads (so every refusal is ours), so a client could name
    any server path here; only what Gradio's upload route stored is accepted.
    """
    if _blank(value):
        return None
    path = file_path(value)
    if not isinstance(path, str) or not path.strip() or "\x00" in path:
        raise InputError(field, "is not an uploaded file", "upload the file (gradio_client: handle_file(path))")
    if uploads is not None:
        inside(path, uploads, field,
               "upload the file (gradio_client: handle_file(path)); a server path is not accepted")
    return path


def _naming_the_file(err: InputError, path: str) -> InputError:
    """The refusal naming the user's file, not Gradio's temp copy (an upload keeps its name as the basename)."""
    return InputError(err.field, err.problem.replace(str(path), Path(path).name), err.fix)


def read_uploaded_prompt(path: str) -> str:
    try:
        return read_prompt_file(path)
    except InputError as err:
        raise _naming_the_file(err, path) from None


def check_image_upload(path: str | None) -> str:
    """The image line under the upload: its size, or the refusal."""
    if path is None:
        return ""
    try:
        width, height = check_image(path)
    except InputError as err:
        raise _naming_the_file(err, path) from None
    return f"{Path(path).name}: {width}x{height}"


def _choice(value: Any, field: str, choices: tuple[str, ...] | list[str], default: str) -> str:
    if _blank(value):
        return default
    if not isinstance(value, str) or value not in choices:
        raise InputError(field, f"{value!r} is not one of the choices", f"use one of {', '.join(choices)}")
    return value


def _flag(value: Any, field: str) -> bool:
    if value is None:
        return True
    if not isinstance(value, bool):
        raise InputError(field, f"{value!r} is not true or false", "use true or false")
    return value


def _request_fields(values: dict[str, Any], capabilities: Capabilities, uploads: Path | None) -> dict[str, Any]:
    """The request model's fields from the form's values: blank means the model's (or engine's) default."""
    fields: dict[str, Any] = {}
    for name in REQUEST_FIELDS:
        value = values.get(name)
        if name == "prompt":
            fields[name] = value  # blank is refused as an empty prompt, not read as "the default"
        elif name in ("prompt_file", "image"):
            fields[name] = upload_path(value, name, uploads)
        elif name == "compile":
            mode = _choice(value, name, (ENGINE_DEFAULT, *capabilities.compile_modes), ENGINE_DEFAULT)
            fields[name] = None if mode == ENGINE_DEFAULT else mode
        elif name == "deterministic":
            fields[name] = _flag(value, name)
        elif name in OPTIONAL_WHOLE or name == "seed":
            fields[name] = _whole(value, name)
        else:
            fields[name] = None if _blank(value) else value
    return fields


def plan_from_form(values: dict[str, Any], capabilities: Capabilities, engine: Engine,
                   uploads: Path | None = None) -> Plan:
    """Validate the form and return the engine's plan for it (request, tier, layout, warnings); raise InputError.

    ``values`` may be raw API payloads: every field is checked here, in the CLI's words, and
    files must lie in ``uploads`` (the studio's upload folder) when it is given. Seed -1 draws
    a seed: the request holds the drawn one, the plan's resolved settings record ``seed_asked``.
    """
    prompt = values.get("prompt") or ""
    if not isinstance(prompt, str):
        raise InputError("prompt", "must be text", "send the prompt as a string")
    mode = values.get("mode") or "t2va"
    # A first frame left in the hidden upload of a T2VA form is not part of the request.
    fields = _request_fields({**values, "prompt": prompt, "mode": mode, **({} if mode == "i2va" else {"image": None})},
                             capabilities, uploads)
    if fields["prompt_file"] is not None:
        text = read_uploaded_prompt(fields["prompt_file"])
        fields["prompt_file"] = Path(fields["prompt_file"]).name
        if not prompt.strip():
            fields["prompt"] = text
    try:
        request, asked_random = build_request_seeding(**{k: v for k, v in fields.items()
                                                         if v is not None or k in ("prompt_file", "image")})
    except InputError as err:
        if err.field == "image" and fields["image"]:
            raise _naming_the_file(err, fields["image"]) from None
        raise
    reason = capabilities.tiers.get(request.tier)
    if reason:
        raise InputError("tier", f"{request.tier} cannot run here: {reason}", "pick a tier that is not greyed out")
    if request.compile is not None and request.compile not in capabilities.compile_modes:
        raise InputError("compile", f"{capabilities.engine} has no compile mode {request.compile!r}",
                         f"use one of {', '.join(capabilities.compile_modes)}")
    layout = layout_from_form(values.get("layout_preset"), values.get("sp"), values.get("cfg"), values.get("ep"))
    plan = engine.plan(request, layout)
    if asked_random:
        plan = plan.with_seed_drawn()
    return plan
