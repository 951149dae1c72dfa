"""The lock is the single source of pins: Dockerfile, compose, pyproject, requirements and
install.sh agree with it, the Dockerfile lints, and its ENV is the deterministic module's."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from magi2studio.cli import build_parser
from magi2studio.determinism import DETERMINISTIC_ENV

from .image_contract import build_image_module

ROOT = Path(__file__).resolve().parents[2]
LOCK = yaml.safe_load((ROOT / "image" / "lock.yaml").read_text(encoding="utf-8"))
DOCKERFILE = (ROOT / "image" / "Dockerfile").read_text(encoding="utf-8")
EXACT = re.compile(r"^\d+(\.\d+)*([a-z0-9.+-]*)$")
KNOWN_KEYS = {"schema", "base_images", "python", "pip", "magi2studio", "vllm", "vllm_omni", "torch", "torchada",
              "ffmpeg", "sandai_assets", "weights"}
PLATFORMS = ("cpu", "cuda", "musa")


def lock_problems(lock: dict) -> list[str]:
    """Why a lock is refused: unknown entries, floating tags, unpinned versions, bad hashes."""

    problems = [f"unknown entry {key!r}" for key in lock if key not in KNOWN_KEYS]
    problems += [f"missing entry {key!r}" for key in KNOWN_KEYS if key not in lock]
    for platform, image in (lock.get("base_images") or {}).items():
        if platform not in PLATFORMS:
            problems.append(f"base_images: unknown platform {platform!r}")
        if ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest") or "@" in image:
            problems.append(f"base_images.{platform}: {image!r} must be a fixed tag (digests are recorded at build)")
    versions = {"pip": lock.get("pip"), "magi2studio": lock.get("magi2studio", {}).get("version"),
                "vllm": lock.get("vllm", {}).get("version"), "vllm_omni": lock.get("vllm_omni", {}).get("version"),
                "torchada": lock.get("torchada", {}).get("version"), "pyav": lock.get("ffmpeg", {}).get("pyav"),
                "torch.cpu": lock.get("torch", {}).get("cpu", {}).get("version"),
                "torch.cuda": lock.get("torch", {}).get("cuda", {}).get("version")}
    problems += [f"{name}: {value!r} is not an exact version" for name, value in versions.items()
                 if not isinstance(value, str) or not EXACT.match(value)]
    for platform, entry in (lock.get("torch") or {}).items():
        if entry.get("source") not in ("pypi-cpu-wheel", "base-image"):
            problems.append(f"torch.{platform}: unknown source {entry.get('source')!r}")
    if lock.get("vllm_omni", {}).get("source") != "pypi":
        problems.append("vllm_omni.source: only pypi is installed by image/install.sh")
    assets = lock.get("sandai_assets", {})
    if not re.fullmatch(r"[0-9a-f]{40}", str(assets.get("commit"))):
        problems.append("sandai_assets.commit must be a full commit hash")
    problems += [f"sandai_assets.sha256.{name}: not a sha256" for name, digest in (assets.get("sha256") or {}).items()
                 if not re.fullmatch(r"[0-9a-f]{64}", str(digest))]
    return problems


def dockerfile_arg_defaults() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S*)$", DOCKERFILE, flags=re.M))


def test_lock_is_pinned_and_known():
    assert lock_problems(LOCK) == []
    assert LOCK["sandai_assets"]["commit"] == "f68a0f9bbccbea56e0177a9bd912abc3b18ffe61"


@pytest.mark.parametrize("edit, expected", [
    (lambda lock: lock.update(extra={"x": 1}), "unknown entry 'extra'"),
    (lambda lock: lock["vllm"].update(version=">=0.30"), "vllm: '>=0.30' is not an exact version"),
    (lambda lock: lock["torchada"].update(version=None), "torchada: None is not an exact version"),
    (lambda lock: lock["base_images"].update(cpu="python:latest"), "must be a fixed tag"),
    (lambda lock: lock["base_images"].update(cuda="vllm/vllm-openai"), "must be a fixed tag"),
    (lambda lock: lock["sandai_assets"]["sha256"].update(LICENSE="abc"), "LICENSE: not a sha256"),
    (lambda lock: lock["vllm_omni"].update(source="git"), "only pypi is installed"),
])
def test_lock_with_unpinned_or_unknown_entry_is_refused(edit, expected):
    lock = yaml.safe_load((ROOT / "image" / "lock.yaml").read_text(encoding="utf-8"))
    edit(lock)
    assert any(expected in problem for problem in lock_problems(lock)), lock_problems(lock)


def test_dockerfile_defaults_equal_the_lock():
    args = dockerfile_arg_defaults()
    assert args["BASE_IMAGE"] == LOCK["base_images"]["cpu"]
    assert args["MAGI2_PLATFORM"] == "cpu"
    assert args["FFMPEG_VERSION"] == LOCK["ffmpeg"]["cpu"]["apt"]
    assert args["CPU_TORCH_INDEX"] == LOCK["torch"]["cpu"]["index"]


def test_compose_platform_build_args_equal_the_lock():
    services = yaml.safe_load((ROOT / "image" / "compose" / "platforms.yaml").read_text())["services"]
    assert set(services) == set(PLATFORMS)
    for platform, service in services.items():
        args = service["build"]["args"]
        assert {key: args[key] for key in ("MAGI2_PLATFORM", "BASE_IMAGE")} == \
            {"MAGI2_PLATFORM": platform, "BASE_IMAGE": LOCK["base_images"][platform]}
        pins = {"BASE_IMAGE_DIGEST": "${MAGI2_BASE_DIGEST:-}", "VLLM_OMNI_COMMIT": "${MAGI2_VLLM_OMNI_COMMIT:-}"}
        assert set(args) - {"MAGI2_PLATFORM", "BASE_IMAGE"} == (set() if platform == "cpu" else set(pins))
        assert all(args[key] == value for key, value in pins.items() if key in args)


def test_pyproject_requirements_and_install_script_equal_the_lock():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = dict(d.split("==") for d in deps["dependencies"])
    assert deps["version"] == LOCK["magi2studio"]["version"]
    assert pins["vllm"] == LOCK["vllm"]["version"] and pins["vllm-omni"] == LOCK["vllm_omni"]["version"]
    assert pins["torch"] == LOCK["torch"]["cpu"]["version"] == LOCK["torch"]["cuda"]["version"]
    assert pins["av"] == LOCK["ffmpeg"]["pyav"]
    app = (ROOT / "image" / "requirements-app.txt").read_text()
    assert f"av=={LOCK['ffmpeg']['pyav']}" in app.split()
    install = (ROOT / "image" / "install.sh").read_text()
    assert f"vllm=={LOCK['vllm']['version']} vllm-omni=={LOCK['vllm_omni']['version']}" in install
    assert f"vllm-omni=={LOCK['vllm_omni']['version']}" in install
    assert f"torch=={LOCK['torch']['cpu']['version']}" in install
    assert f"torchada=={LOCK['torchada']['version']}" in install
    assert f"pip_install -q pip=={LOCK['pip']}\n" in install
    # Every requirement file pins exactly, and pyproject's pins agree with them.
    for name in ("requirements-app.txt", "requirements-upstream.txt", "requirements-test.txt"):
        for line in (ROOT / "image" / name).read_text().splitlines():
            spec = line.split("#")[0].strip()
            if spec:
                assert re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[\w.+-]+", spec), f"{name}: {spec!r} is not an exact pin"
                package, version = spec.split("==")
                if package in pins:
                    assert pins[package] == version, f"{name} pins {spec}, pyproject {pins[package]}"


def test_sandai_assets_match_the_lock():
    shared = ROOT.parent / "shared" / "sandai-assets"
    recorded = LOCK["sandai_assets"]["sha256"]
    if not shared.is_dir():
        pytest.skip(f"{shared} is not here")
    assert sorted(p.name for p in shared.iterdir() if p.is_file()) == sorted(recorded)
    for name, digest in recorded.items():
        assert hashlib.sha256((shared / name).read_bytes()).hexdigest() == digest, name
    bundled = ROOT / "magi2studio" / "data" / "sandai"
    for path in bundled.rglob("*") if bundled.is_dir() else ():
        if path.name in recorded:
            assert hashlib.sha256(path.read_bytes()).hexdigest() == recorded[path.name], path


def test_hadolint_passes():
    hadolint = Path(sys.executable).with_name("hadolint")
    result = subprocess.run([str(hadolint), str(ROOT / "image" / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_image_env_is_the_deterministic_module():
    block = re.search(r"^ENV (TORCHINDUCTOR_FORCE_FILTER_REDUCTION_CONFIGS=.*?)(?=^\S)", DOCKERFILE, re.M | re.S)
    pairs = dict(item.split("=", 1) for item in block[1].replace("\\\n", " ").split())
    assert pairs == DETERMINISTIC_ENV


def test_image_runs_as_non_root_with_healthcheck_and_entrypoint():
    users = re.findall(r"^USER (\S+)$", DOCKERFILE, re.M)
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert re.search(r"^HEALTHCHECK .*\n\s+CMD .*127\.0\.0\.1:7860/health/ready'", DOCKERFILE, re.M)
    assert re.search(r'^ENTRYPOINT \["magi2studio"\]$', DOCKERFILE, re.M)
    served = build_parser().parse_args(json.loads(re.search(r"^CMD (\[.*\])$", DOCKERFILE, re.M)[1]))
    assert (served.command, served.host, served.port, served.engine) == ("studio", "0.0.0.0", 7860, "embedded")


def test_build_info_records_provenance(tmp_path):
    out = tmp_path / "etc" / "build-info.json"
    lock = ROOT / "image" / "lock.yaml"
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()
    cmd = [sys.executable, str(ROOT / "image" / "build_info.py"), "--lock", str(lock), "--out", str(out),
           "--platform", "cpu", "--base", LOCK["base_images"]["cpu"], "--revision", "abc123", "--lock-sha256", digest]
    subprocess.run(cmd, check=True, capture_output=True)
    info = json.loads(out.read_text())
    assert info["lock_sha256"] == digest and info["git_revision"] == "abc123"
    assert info["base_image"] == LOCK["base_images"]["cpu"] and info["base_image_digest"] is None
    assert "not passed" in info["base_image_digest_note"] and info["build_date"]
    assert any(line.startswith("pyyaml==") or line.startswith("PyYAML==") for line in info["pip_freeze"])
    bad = subprocess.run([*cmd[:-1], "0" * 64], capture_output=True, text=True)
    assert bad.returncode != 0 and "does not match" in bad.stderr


def _build_image(*args: str, path: str = "/usr/bin:/bin", **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "build-image"), *args], capture_output=True,
                          text=True, env={"PATH": path, **env})


def test_build_image_refuses_docker_without_an_engine(tmp_path):
    result = _build_image("--builder", "docker", DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock")
    assert result.returncode == 2
    assert "no Docker engine is reachable" in result.stderr and "nothing was built" in result.stderr
    assert "Traceback" not in result.stderr


def test_build_image_refuses_without_any_builder(tmp_path):
    result = _build_image(path=str(tmp_path))
    assert result.returncode == 2 and "buildah is not installed" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("platform", ["cuda", "musa"])
@pytest.mark.parametrize("args, expected", [
    ((), "needs --base-digest and --vllm-omni-commit"),
    (("--base-digest", "sha256:" + "a" * 64), "needs --vllm-omni-commit"),
    (("--base-digest", "sha256:" + "a" * 64, "--vllm-omni-commit", "main"), "'main' is not a full 40-hex commit"),
    (("--base-digest", "latest", "--vllm-omni-commit", "b" * 40), "'latest' is not sha256:<64 hex>"),
])
def test_gpu_builds_refuse_a_moving_base_or_source(platform, args, expected):
    result = _build_image("--platform", platform, *args)
    assert result.returncode == 2 and expected in result.stderr and "Traceback" not in result.stderr


def test_gpu_build_args_pin_the_base_by_digest():
    digest, commit = "sha256:" + "a" * 64, "b" * 40
    args = build_image_module().build_args(LOCK, "cuda", base_image=LOCK["base_images"]["cuda"], base_digest=digest,
                                           revision="r", cpu_torch_index="", vllm_omni_commit=commit)
    assert args["BASE_IMAGE"] == f"{LOCK['base_images']['cuda']}@{digest}" and args["VLLM_OMNI_COMMIT"] == commit
    assert set(args) <= set(dockerfile_arg_defaults()) | {"BASE_IMAGE_DIGEST", "VLLM_OMNI_COMMIT", "GIT_REVISION",
                                                          "LOCK_SHA256", "BUILD_DATE"}


def test_lock_pins_the_weights_snapshot_vllm_omni_pins():
    from vllm_omni.diffusion.models.magi2.pipeline_magi2 import MAGI2_MODEL_ID, MAGI2_MODEL_REVISION

    assert LOCK["weights"]["repository"] == MAGI2_MODEL_ID
    assert LOCK["weights"]["revision"] == MAGI2_MODEL_REVISION
    assert f"--revision {MAGI2_MODEL_REVISION}" in (ROOT / "docs" / "container.md").read_text()
