"""The Generate form's values -> the engine's Plan (request and layout checked once), the same way for page and API.

Every refusal is the vocabulary's :class:`InputError` (the CLI's words); ``box_for`` says
which error line of the form shows it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..engines.base import Capabilities, Engine, Plan
from ..errors import InputError
from ..layouts import PRESETS, Layout, check_shape, memory_fit_line, parse_layout
from ..paths import inside
from ..request import build_request, check_image, read_prompt_file, whole_number
from ..tiers import get_tier

CUSTOM = "custom"
ENGINE_DEFAULT = "engine default"

# The form's request fields, in the order the generate event (page and API) takes them.
FIELDS = ("mode", "prompt", "prompt_file", "image", "negative_prompt", "seed", "tier", "steps",
          "refiner_steps", "video_cfg", "audio_cfg", "compile", "deterministic",
          "layout_preset", "sp", "cfg", "ep")

# Which error line of the form shows a refusal of each field; anything else shows under the button.
BOXES = ("prompt", "image", "sampling", "tier", "layout", "general")
_BOX_OF = {"mode": "prompt", "prompt": "prompt", "prompt_file": "prompt", "negative_prompt": "prompt",
           "image": "image", "seed": "sampling", "steps": "sampling", "refiner_steps": "sampling",
           "video_cfg": "sampling", "audio_cfg": "sampling", "compile": "sampling",
           "deterministic": "sampling", "tier": "tier", "layout": "layout"}


def box_for(field: str) -> str:
    return _BOX_OF.get(field.split(".")[0], "general")


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


def plan_from_form(values: dict[str, Any], capabilities: Capabilities, engine: Engine,
                   uploads: Path | None = None) -> Plan:
    """Validate the form and return the engine's plan for it (request, tier, layout, warnings); raise InputError.

    ``values`` may be raw API payloads: every field is checked here, in the CLI's words, and
    files must lie in ``uploads`` (the studio's upload folder) when it is given.
    """
    prompt = values.get("prompt") or ""
    if not isinstance(prompt, str):
        raise InputError("prompt", "must be text", "send the prompt as a string")
    prompt_file = upload_path(values.get("prompt_file"), "prompt_file", uploads)
    prompt_file_name = None
    if prompt_file is not None:
        text = read_prompt_file(prompt_file)
        prompt_file_name = Path(prompt_file).name
        if not prompt.strip():
            prompt = text
    mode = values.get("mode") or "t2va"
    image = upload_path(values.get("image"), "image", uploads) if mode == "i2va" else None
    compile_mode = _choice(values.get("compile"), "compile", (ENGINE_DEFAULT, *capabilities.compile_modes),
                           ENGINE_DEFAULT)
    fields = {
        "mode": mode,
        "prompt": prompt,
        "prompt_file": prompt_file_name,
        "image": image,
        "negative_prompt": None if _blank(values.get("negative_prompt")) else values["negative_prompt"],
        "seed": _whole(values.get("seed"), "seed"),
        "tier": values.get("tier") or "272p",
        "steps": _whole(values.get("steps"), "steps"),
        "refiner_steps": _whole(values.get("refiner_steps"), "refiner_steps"),
        "video_cfg": values.get("video_cfg"),
        "audio_cfg": values.get("audio_cfg"),
        "compile": None if _blank(compile_mode) or compile_mode == ENGINE_DEFAULT else compile_mode,
        "deterministic": _flag(values.get("deterministic", True), "deterministic"),
    }
    request = build_request(**{k: v for k, v in fields.items() if v is not None or k in ("prompt_file", "image")})
    reason = capabilities.tiers.get(request.tier)
    if reason:
        raise InputError("tier", f"{request.tier} cannot run here: {reason}", "pick a tier that is not greyed out")
    if request.compile is not None and request.compile not in capabilities.compile_modes:
        raise InputError("compile", f"{capabilities.engine} has no compile mode {request.compile!r}",
                         f"use one of {', '.join(capabilities.compile_modes)}")
    layout = layout_from_form(values.get("layout_preset"), values.get("sp"), values.get("cfg"), values.get("ep"))
    return engine.plan(request, layout)


def layout_report(values: dict[str, Any], capabilities: Capabilities, engine: Engine, gpu_gib: float) -> str:
    """The live layout line: the check's verdict, warnings, memory fit, and a restart notice."""
    try:
        layout = layout_from_form(values.get("layout_preset"), values.get("sp"), values.get("cfg"), values.get("ep"))
        warnings = engine.check_layout(layout, get_tier(values.get("tier") or "272p"))
    except InputError as err:
        return f"✗ {err}"
    lines = [f"✓ {layout.name}: world size {layout.world_size}, MoE heads split {layout.moe_shards} ways on "
             f"{capabilities.engine}"]
    lines += [f"⚠ {warning}" for warning in warnings]
    lines.append(f"Real checkpoint, per GPU: {memory_fit_line(layout, gpu_gib)}")
    current = engine.layout
    if current is not None and current != layout:
        lines.append(f"↻ Generating will restart the engine: it runs {current.name} now, this is {layout.name}.")
    return "\n\n".join(lines)


def check_image_upload(path: str | None) -> str:
    """The image line under the upload: its size, or the refusal."""
    if path is None:
        return ""
    width, height = check_image(path)
    return f"{Path(path).name}: {width}x{height}"
