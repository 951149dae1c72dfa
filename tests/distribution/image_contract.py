"""What a user of `docker compose up` relies on in the image, per platform: one place that both
the build/run test (test_image_build.py, on the built cpu image) and the compose drift test
(test_compose.py, on compose.yaml) compare against, so the two cannot drift apart."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
LOCK = yaml.safe_load((ROOT / "image" / "lock.yaml").read_text(encoding="utf-8"))
DOCKERFILE = (ROOT / "image" / "Dockerfile").read_text(encoding="utf-8")

USER = "10001:10001"
STUDIO_PORT = 7860
OUTPUTS = "/outputs"
WEIGHTS = LOCK["weights"]["mount"]
LOCAL_BASE = "localhost/magi2studio-base:bookworm-py311"
IMAGE_MAX_BYTES = 3 * 10**9
OCI_LABELS = ("org.opencontainers.image.title", "org.opencontainers.image.revision",
              "org.opencontainers.image.created", "org.opencontainers.image.base.digest",
              "org.opencontainers.image.base.name", "io.magi2studio.platform", "io.magi2studio.lock.sha256")


def build_image_module():
    """scripts/build-image as a module (it has no .py suffix), to read the build args it passes."""

    path = ROOT / "scripts" / "build-image"
    loader = importlib.machinery.SourceFileLoader("build_image", str(path))
    spec = importlib.util.spec_from_loader("build_image", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def build_args(platform: str, base_digest: str = "", vllm_omni_commit: str = "") -> dict[str, str]:
    """The build args a compose build must agree with: what scripts/build-image passes from the lock
    (the cpu build resolves its base digest from the local store; compose leaves it to the engine)."""

    args = build_image_module().build_args(
        LOCK, platform, base_image=LOCK["base_images"][platform], base_digest=base_digest, revision="",
        cpu_torch_index=LOCK["torch"]["cpu"]["index"], vllm_omni_commit=vllm_omni_commit)
    wanted = {"MAGI2_PLATFORM": args["MAGI2_PLATFORM"],
              # cuda/musa build FROM tag@digest; compose names the tag and passes the digest apart.
              "BASE_IMAGE": args["BASE_IMAGE"].split("@")[0]}
    if platform != "cpu":
        wanted |= {"BASE_IMAGE_DIGEST": args["BASE_IMAGE_DIGEST"], "VLLM_OMNI_COMMIT": args["VLLM_OMNI_COMMIT"]}
    return wanted


def mounts(platform: str) -> dict[str, bool]:
    """Container path -> read-only. Outputs are written; the weights (GPU platforms) never are."""

    return {OUTPUTS: False} if platform == "cpu" else {OUTPUTS: False, WEIGHTS: True}


def devices(platform: str) -> dict:
    return {"cpu": {},
            "cuda": {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]},
            "musa": {"runtime": "mthreads"}}[platform]


def dockerfile_env() -> dict[str, str]:
    """Every ENV of image/Dockerfile, with ${MAGI2_PLATFORM} left for the platform to fill in."""

    env: dict[str, str] = {}
    for block in re.findall(r"^ENV (.*?)(?<!\\)\n", DOCKERFILE, flags=re.M | re.S):
        for item in block.replace("\\\n", " ").split():
            key, value = item.split("=", 1)
            env[key] = value
    return env


def environment(platform: str) -> dict[str, str]:
    """The environment the studio process sees (the image's ENV plus compose's), minus PATH."""

    env = {key: value.replace("${MAGI2_PLATFORM}", platform) for key, value in dockerfile_env().items()
           if key != "PATH"}
    if platform == "musa":
        env |= {"MTHREADS_VISIBLE_DEVICES": "all", "MTHREADS_DRIVER_CAPABILITIES": "compute,utility"}
    return env


def run_spec(platform: str, base_digest: str = "", vllm_omni_commit: str = "") -> dict:
    """Everything above for one platform, in one comparable value."""

    return {"build_args": build_args(platform, base_digest, vllm_omni_commit), "mounts": mounts(platform), "user": USER,
            "ports": [STUDIO_PORT], "devices": devices(platform), "environment": environment(platform)}
