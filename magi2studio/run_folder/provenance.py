"""Where this install came from: package versions and the image's build-info, if any."""

from __future__ import annotations

import json
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

BUILD_INFO_PATH = Path(os.environ.get("MAGI2STUDIO_BUILD_INFO", "/etc/magi2studio/build-info.json"))
TRACKED_PACKAGES = (
    "magi2studio", "torch", "vllm", "vllm-omni", "torchada", "torch_musa", "triton", "numpy", "av",
    "diffusers", "transformers", "gradio",
)


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    versions["python"] = platform.python_version()
    return versions


def build_info() -> dict[str, Any] | None:
    """The image's /etc/magi2studio/build-info.json, or None outside an image."""

    try:
        return json.loads(BUILD_INFO_PATH.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
