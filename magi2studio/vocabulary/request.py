"""The generation request: what the user asks for, validated, and round-tripped through YAML.

Every refusal is an :class:`InputError` naming the field and the fix. Nothing here imports
torch, so the CLI and the studio can validate before any engine starts.
"""

from __future__ import annotations

import math
import secrets
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer

from ..errors import InputError
from .paths import contained, read_text, regular_file
from .tiers import TIERS, Tier, get_tier

MAX_PROMPT_FILE_BYTES = 256 * 1024  # Sand AI's published prompts are 9-11 k characters
MAX_PROMPT_CHARS = 200_000
MAX_STEPS = 1000
MAX_REFINER_STEPS = 50
MAX_SEED = 2**63 - 1
RANDOM_SEED = -1  # asked for (studio or --seed -1): a seed is drawn, and the run records the drawn one
DRAWN_SEED_BOUND = 2**31  # drawn seeds stay below it, short enough to read out and type back
IMAGE_MIN_SIDE = 16
IMAGE_MAX_SIDE = 8192
IMAGE_MAX_ASPECT = 8.0
MAX_IMAGE_BYTES = 32 * 1024 * 1024  # an 8192x8192 PNG of a photo is about 100 MB; first frames are small

CompileMode = Literal["static", "dynamic", "eager"]


class Request(BaseModel):
    """One T2VA or I2VA generation. ``None`` means "the engine's default" (recorded resolved)."""

    model_config = ConfigDict(extra="forbid", strict=False, frozen=True)

    # title and description are the studio form's label and help text (studio/form.py derives its fields here).
    mode: Literal["t2va", "i2va"] = Field("t2va", title="Mode")
    prompt: str = Field(title="Prompt")
    prompt_file: str | None = Field(None, title="Prompt file", description="UTF-8 text or JSON, read as it is")
    image: str | None = Field(None, title="First-frame image", description="JPEG or PNG, for I2VA")
    negative_prompt: str | None = Field(None, title="Negative prompt",
                                        description="blank: the engine's (upstream's default negative prompt)")
    seed: int = Field(42, title="Seed", description="-1 draws a random seed; the drawn one is recorded")
    tier: str = Field("272p", title="Tier")
    steps: int | None = Field(None, title="Steps", description="denoising steps; blank: the engine's default")
    refiner_steps: int | None = Field(None, title="Refiner steps (1080p)",
                                      description="the 1080p refiner's steps; blank: the engine's default")
    preview_every: int | None = Field(None, title="Live preview every", description=(
        "steps between live previews of the clip being denoised; 0: off; blank: the engine's default"))
    video_cfg: float = Field(5.0, title="Video CFG scale", description=(
        "classifier-free guidance for the picture: higher follows the prompt more closely, "
        "too high over-saturates; 0 to 50"))
    audio_cfg: float = Field(7.0, title="Audio CFG scale", description=(
        "classifier-free guidance for the sound track: higher follows the prompt more closely; 0 to 50"))
    compile: CompileMode | None = Field(None, title="Compile mode", description=(
        "torch.compile: static and dynamic compile once (slow first run, faster steps), eager never "
        "compiles; blank: the engine's default"))
    deterministic: bool = Field(True, title="Deterministic", description=(
        "torch's deterministic algorithms: the same request on the same layout and machine gives "
        "identical output hashes"))
    output_width: int | None = Field(None, title="Output width",
                                     description="delivered width; blank: the tier's generated size")
    output_height: int | None = Field(None, title="Output height", description=(
        "delivered height; blank: the tier's generated size (1080p generates 1088; 1080 resizes it)"))

    @field_validator("seed", "steps", "refiner_steps", "preview_every", "output_width", "output_height",
                     mode="before")
    @classmethod
    def _integers_only(cls, value: Any) -> Any:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError("must be a whole number")
        if isinstance(value, str):
            raise ValueError("must be a whole number, not text")
        return value

    @model_serializer(mode="wrap")
    def _without_unset_preview(self, handler) -> dict[str, Any]:
        """A request that leaves ``preview_every`` blank dumps as before the field existed, so the
        manifests, request.yaml files and reproduce keys of earlier runs still verify and match."""

        data = handler(self)
        if data.get("preview_every") is None:
            data.pop("preview_every", None)
        return data

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, allow_unicode=True, width=100)

    @classmethod
    def from_yaml(cls, text: str, *, source: str = "request", root: Path | None = None) -> Request:
        """A request from YAML; a ``prompt_file`` in it is read from inside ``root`` (the YAML's folder)."""

        try:
            data = yaml.safe_load(text)
        except (yaml.YAMLError, RecursionError) as err:
            raise InputError(source, f"not valid YAML ({err.__class__.__name__})", "fix the YAML syntax") from None
        if not isinstance(data, dict) or not all(isinstance(key, str) for key in data):
            raise InputError(source, "must be a mapping of request fields", "write key: value lines")
        if "prompt" not in data and data.get("prompt_file"):
            if root is None:
                raise InputError("prompt_file", "a prompt file named inside a request needs the request's folder",
                                 "put the prompt text in the request's prompt field")
            file = contained(data["prompt_file"], root, "prompt_file")
            data = {**data, "prompt": read_prompt_file(file), "prompt_file": str(file)}
        return build_request(**data)


def draw_seed() -> int:
    """A fresh random seed (from the OS's entropy, not torch's or Python's seeded generators)."""
    return secrets.randbelow(DRAWN_SEED_BOUND)


def build_request_seeding(**fields: Any) -> tuple[Request, bool]:
    """:func:`build_request` at a door that takes seed -1 (the CLI's flags, the studio form): -1 draws
    a seed, and the second value says it did; a seed refusal names -1 in its fix."""
    drawn = whole_number(fields.get("seed"), "seed") == RANDOM_SEED
    if drawn:
        fields["seed"] = draw_seed()
    try:
        return build_request(**fields), drawn
    except InputError as err:
        if err.field == "seed":
            raise InputError("seed", err.problem, f"{err.fix}, or -1 for a random seed") from None
        raise


def whole_number(value: Any, field: str) -> Any:
    """The one parser of whole numbers typed as text (CLI flags, studio fields) or sent as numbers.

    ``None`` stays ``None`` (the default); text and integral floats become ints; anything else
    is returned for the request model to refuse in its own words.
    """
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise InputError(field, f"{value.strip()!r} is not a whole number",
                             "give a whole number, or leave it out for the default") from None
    if isinstance(value, float) and not isinstance(value, bool):
        if not value.is_integer():
            raise InputError(field, f"{value} is not a whole number", "use a whole number")
        return int(value)
    return value


_FIXES = {
    "mode": "use t2va or i2va",
    "prompt": "give a non-empty prompt",
    "seed": "use a whole number from 0 to 2^63-1",
    "steps": f"use a whole number from 1 to {MAX_STEPS}",
    "refiner_steps": f"use a whole number from 1 to {MAX_REFINER_STEPS}",
    "video_cfg": "use a finite number such as 5.0",
    "audio_cfg": "use a finite number such as 7.0",
    "compile": "use static, dynamic or eager",
    "deterministic": "use true or false",
    "output_width": "leave it out for the generated size, or give a whole number",
    "output_height": "leave it out for the generated size, or give a whole number",
}


def build_request(**fields: Any) -> Request:
    """Construct and validate a request; the one entry point for CLI, YAML, studio and API."""

    try:
        request = Request(**fields)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "request"
        if first["type"] == "extra_forbidden":
            allowed = ", ".join(Request.model_fields)
            raise InputError(field, "is not a request field", f"remove it; the fields are {allowed}") from None
        if first["type"] == "missing":
            raise InputError(field, "is required", _FIXES.get(field, "add it")) from None
        raise InputError(field, first["msg"].lower(), _FIXES.get(field, "correct its type")) from None
    return validate_request(request)


def validate_request(request: Request) -> Request:
    if not request.prompt.strip():
        raise InputError("prompt", "is empty", "give a prompt or a prompt file with text in it")
    for name in ("prompt", "negative_prompt"):
        text = getattr(request, name)
        if text is not None and len(text) > MAX_PROMPT_CHARS:
            raise InputError(name, f"is {len(text)} characters", f"keep it under {MAX_PROMPT_CHARS}")
        if text is not None and "\x00" in text:
            raise InputError(name, "holds a NUL character", "remove it (prompts are plain text)")
    tier = get_tier(request.tier)
    if request.tier not in TIERS:
        raise InputError("tier", f"write the tier in lower case ({request.tier.lower()})", "e.g. 272p")
    if not 0 <= request.seed <= MAX_SEED:
        raise InputError("seed", f"{request.seed} is out of range", _FIXES["seed"])
    if request.steps is not None and not 1 <= request.steps <= MAX_STEPS:
        raise InputError("steps", f"{request.steps} is out of range", _FIXES["steps"])
    if request.refiner_steps is not None and not 1 <= request.refiner_steps <= MAX_REFINER_STEPS:
        raise InputError("refiner_steps", f"{request.refiner_steps} is out of range", _FIXES["refiner_steps"])
    if request.preview_every is not None and not 0 <= request.preview_every <= MAX_STEPS:
        raise InputError("preview_every", f"{request.preview_every} is out of range",
                         f"use 0 (off) to {MAX_STEPS} steps, or leave it blank")
    output_size(request, tier)
    for name in ("video_cfg", "audio_cfg"):
        value = getattr(request, name)
        if not math.isfinite(value) or not 0 <= value <= 50:
            raise InputError(name, f"{value} is not a usable guidance scale", "use a number from 0 to 50")
    if request.mode == "i2va":
        if not request.image:
            raise InputError("image", "I2VA needs a first-frame image",
                             "give one (--image PATH on the command line), or use mode t2va")
        check_image(request.image)
    elif request.image:
        raise InputError("image", "a first-frame image was given for T2VA", "use mode i2va, or drop the image")
    return request


def output_size(request: Request, tier: Tier) -> tuple[int, int]:
    """The delivered (width, height): the tier's generated size unless a listed resize is asked for."""

    width = tier.width if request.output_width is None else request.output_width
    height = tier.height if request.output_height is None else request.output_height
    if (width, height) in tier.output_sizes:
        return width, height
    sizes = " or ".join(f"{w}x{h}" for w, h in tier.output_sizes)
    field = "output_width" if width not in {w for w, _ in tier.output_sizes} else "output_height"
    value = width if field == "output_width" else height
    fix = (f"use {sizes} ({tier.width}x{tier.height} is generated, the others are resizes of it)"
           if tier.resized else f"leave it out: the {tier.name} tier delivers its generated {sizes}")
    raise InputError(field, f"{value} is not an output size of the {tier.name} tier", fix)


def read_prompt_file(path: str | Path) -> str:
    """Read a prompt file as Sand AI's entry script does: UTF-8, stripped, passed through."""

    text = read_text(path, "prompt_file", "a text or JSON prompt file", MAX_PROMPT_FILE_BYTES,
                     noun="prompt file")
    text = text.strip()
    if not text:
        raise InputError("prompt_file", f"{path} is empty", "put the prompt text in the file")
    return text


def check_image(path: str | Path) -> tuple[int, int]:
    """Open, fully decode and size-check a first-frame image. Returns (width, height)."""

    from PIL import Image, UnidentifiedImageError

    file = Path(path)
    info = regular_file(file, "image", "a JPEG or PNG first frame")
    if info.st_size > MAX_IMAGE_BYTES:
        raise InputError("image", f"{path} is {info.st_size} bytes", f"use an image under {MAX_IMAGE_BYTES >> 20} MiB")
    try:
        with Image.open(file) as image:
            width, height = image.size
            if max(width, height) > IMAGE_MAX_SIDE or min(width, height) < IMAGE_MIN_SIDE:
                raise InputError(
                    "image",
                    f"{path} is {width}x{height}",
                    f"use an image with sides from {IMAGE_MIN_SIDE} to {IMAGE_MAX_SIDE} pixels",
                )
            if max(width, height) / min(width, height) > IMAGE_MAX_ASPECT:
                raise InputError(
                    "image", f"{path} is {width}x{height}", f"use an aspect ratio under {IMAGE_MAX_ASPECT:.0f}:1"
                )
            image.load()
    except InputError:
        raise
    except UnidentifiedImageError:
        raise InputError("image", f"{path} is not an image", "give a JPEG or PNG file") from None
    except (OSError, SyntaxError, ValueError) as err:
        raise InputError("image", f"{path} is truncated or corrupt ({err})", "re-export the image") from None
    except Image.DecompressionBombError:
        raise InputError("image", f"{path} has absurd dimensions", "use a smaller image") from None
    return width, height
