"""The cpu image, built from a clean checkout with scripts/build-image (buildah, no daemon) and
run with `buildah run`: what a user of `docker compose up` relies on holds inside it.

Once per session: the local base (scripts/make-base-image --if-missing, cached between runs),
the image, and one working container that every test runs its commands in. `podman run` fails
on setrlimit on these machines; `buildah run --network host` works and serves ports to the host.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from . import image_contract as contract
from .test_weights import synthetic_tree

ROOT = contract.ROOT
BUILDAH = ["buildah", "--storage-driver", "vfs"]
IMAGE = "localhost/magi2studio:cpu"
SECOND_BUILD = "localhost/magi2studio:cpu-second-build"
PROMPT = "a red kite over a grey sea, wind and gulls"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not shutil.which("buildah") or not shutil.which("debootstrap") or os.geteuid() != 0,
                       reason="needs root, buildah and debootstrap "
                              "(apt-get install buildah debootstrap; .ci/run does)"),
]


@dataclass
class Built:
    container: str
    inspect: dict
    revision: str
    base_digest: str
    build_seconds: float
    build_log: str
    out: Path  # build-image --out: image.json (config and layer digests), build-info.json, sbom.cdx.json


def _run(cmd: list[str], timeout: float = 900, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)


def in_image(built: Built, *command: str, mounts: dict[str, tuple[Path, bool]] | None = None,
             timeout: float = 600) -> subprocess.CompletedProcess:
    """One command in the working container, as the image's user, with host paths mounted."""

    volumes = [f"--volume={src}:{dst}:{'ro' if ro else 'rw'}" for dst, (src, ro) in (mounts or {}).items()]
    return _run([*BUILDAH, "run", "--isolation", "chroot", "--network", "host", *volumes, built.container, "--",
                 *command], timeout=timeout)


def _ours(name: str) -> bool:
    """A tag this module's builds make: ``cpu``, ``cpu-<revision>`` (build-image's) and the second build's. Not
    a person's own images in the same store (``magi2studio:cuda``, ``:musa``, ``:mine``: scripts/test runs this)."""
    return name == IMAGE or name == SECOND_BUILD or re.fullmatch(re.escape(IMAGE) + r"-[0-9a-f]{12}", name) is not None


def remove_earlier_runs(buildah: list[str] = BUILDAH, scratch: Path = Path("/var/tmp")) -> list[str]:
    """What earlier runs of this module left in a store that outlives them (CI's does): the images it tags
    (:func:`_ours`: each build also tags ``cpu-<revision>``, and until 9df432e none was removed: ~3 GB each under
    vfs), the working containers of those images and of the base (a killed build's; the base image itself stays),
    untagged images, and containers/storage's blob folders over an hour old in ``scratch`` (a build killed while
    committing leaves one as large as its layer). Returns the tags removed."""
    containers = json.loads(_run([*buildah, "containers", "--json"]).stdout or "null") or []
    stale = [c["id"] for c in containers
             if _ours(c.get("imagename") or "") or (c.get("imagename") or "") == contract.LOCAL_BASE]
    if stale:
        _run([*buildah, "rm", *stale])
    images = json.loads(_run([*buildah, "images", "--json"]).stdout or "null") or []
    tags = sorted({name for image in images for name in image.get("names") or [] if _ours(name)})
    if tags:
        _run([*buildah, "rmi", "--force", *tags])
    _run([*buildah, "rmi", "--prune"])
    for folder in scratch.glob("storage[0-9]*"):
        if folder.is_dir() and time.time() - folder.stat().st_mtime > 3600:
            shutil.rmtree(folder, ignore_errors=True)
    return tags


def test_an_earlier_runs_images_and_containers_are_removed_and_the_base_kept(tmp_path):
    """On a private store: the leak that filled CI's disk (exit 1 at f432c48: no space left in the first build)."""
    store = [*BUILDAH, "--root", str(tmp_path / "root"), "--runroot", str(tmp_path / "run")]
    scratch = tmp_path / "var-tmp"
    (scratch / "storage123").mkdir(parents=True)
    os.utime(scratch / "storage123", (time.time() - 7200, time.time() - 7200))
    (scratch / "storage456").mkdir()  # a build's blob folder in use now
    empty = _run([*store, "from", "scratch"]).stdout.strip()
    mine = "localhost/magi2studio:cuda"  # a person's own build in the same store: scripts/test runs this module
    for tag in ("localhost/magi2studio:cpu-0123456789ab", "localhost/magi2studio:cpu", contract.LOCAL_BASE, mine):
        assert _run([*store, "commit", "--quiet", empty, tag]).returncode == 0
    working = _run([*store, "from", "localhost/magi2studio:cpu"]).stdout.strip()
    from_base = _run([*store, "from", contract.LOCAL_BASE]).stdout.strip()
    from_mine = _run([*store, "from", mine]).stdout.strip()
    assert working and from_base and from_mine

    ours = ["localhost/magi2studio:cpu", "localhost/magi2studio:cpu-0123456789ab"]
    assert remove_earlier_runs(store, scratch) == ours
    names = _run([*store, "images", "--format", "{{.Name}}:{{.Tag}}"]).stdout.split()
    assert sorted(names) == sorted([contract.LOCAL_BASE, mine])
    left = json.loads(_run([*store, "containers", "--json"]).stdout or "null") or []
    # the one made from scratch and the person's own, not this module's builds'
    assert sorted(c["containername"] for c in left) == sorted([empty, from_mine])
    assert sorted(p.name for p in scratch.iterdir()) == ["storage456"]


@pytest.fixture(scope="module")
def image_build(tmp_path_factory) -> Built:
    """The first build, and no container yet: vfs copies the whole image into every container, so the second
    build (the first test) runs before one exists. The tags this module made go at its end: each image is ~3 GB."""
    before = _free_gb("/var/lib/containers")
    removed = remove_earlier_runs()
    print(f"\nearlier runs' images removed: {removed or 'none'} ({before} before, {_free_gb('/var/lib/containers')} "
          "after)", file=sys.stderr)
    clone = tmp_path_factory.mktemp("checkout") / "magi2studio"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    revision = _run(["git", "-C", str(clone), "rev-parse", "HEAD"]).stdout.strip()
    base = _run([str(clone / "scripts" / "make-base-image"), "--if-missing", "--tag", contract.LOCAL_BASE])
    assert base.returncode == 0, base.stdout + base.stderr
    out = tmp_path_factory.mktemp("first-build")
    tags = [IMAGE, f"{IMAGE}-{revision[:12]}"]
    try:
        build, seconds = _build_image(clone, out)
        base_digest = _run([*BUILDAH, "inspect", "--type", "image", "--format", "{{.FromImageDigest}}",
                            contract.LOCAL_BASE]).stdout.strip()
        inspect = json.loads(_run([*BUILDAH, "inspect", "--type", "image", IMAGE]).stdout)
        yield Built("", inspect, revision, base_digest, seconds, build.stdout, out)
    finally:
        _run([*BUILDAH, "rmi", *tags, SECOND_BUILD])


@pytest.fixture(scope="module")
def built(image_build) -> Built:
    """The first build with one working container that every test runs its commands in."""
    container = _run([*BUILDAH, "from", "--quiet", IMAGE], timeout=1800).stdout.strip()
    assert container, "buildah from gave no working container"
    try:
        yield dataclasses.replace(image_build, container=container)
    finally:
        _run([*BUILDAH, "rm", container])


def _free_gb(path: str) -> str:
    return f"{shutil.disk_usage(path).free / 1e9:.1f} GB free on {path}"


def _build_image(clone: Path, out: Path, *tags: str) -> tuple[subprocess.CompletedProcess, float]:
    # vfs holds the working container, the layer's blob and the stored layer at once: about 3x the image.
    free_before = ", ".join(_free_gb(path) for path in ("/var/lib/containers", "/var/tmp"))
    started = time.monotonic()
    build = _run(["nice", "-n", "10", sys.executable, str(clone / "scripts" / "build-image"), "--platform", "cpu",
                  "--builder", "buildah", "--base-image", contract.LOCAL_BASE, "--cpu-torch-index", "",
                  "--out", str(out), *[arg for tag in tags for arg in ("--tag", tag)]], timeout=1800)
    seconds = time.monotonic() - started
    assert build.returncode == 0, (build.stdout[-4000:] + build.stderr[-4000:]
                                   + f"\nbefore the build: {free_before}; after: {_free_gb('/var/lib/containers')}")
    print(f"\nimage build from {clone}: {seconds:.0f} s", file=sys.stderr)
    return build, seconds


@pytest.mark.timeout(2700)  # its setup is the first build: two builds (482 s each at load 10 here)
def test_a_second_clean_clone_elsewhere_builds_the_same_image_bit_for_bit(image_build, tmp_path_factory):
    """Issue 30: the same commit on the same base, from another folder at another time, gives the same image id
    (the docker-format config's digest) and the same layers. Only the base is shared: nothing is cached."""
    clone = tmp_path_factory.mktemp("elsewhere") / "deeper" / "m2s"
    clone.parent.mkdir()
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    out = tmp_path_factory.mktemp("second-build")
    _build_image(clone, out, SECOND_BUILD)
    first, second = (json.loads((folder / "image.json").read_text()) for folder in (image_build.out, out))
    print(f"\nfirst: {first['config_digest']} {first['layers']} (buildah wrote {first.get('built_config_digest')})"
          f"\nsecond: {second['config_digest']} {second['layers']} (buildah wrote {second.get('built_config_digest')})",
          file=sys.stderr)
    assert first["layers"][0] == image_build.inspect["OCIv1"]["rootfs"]["diff_ids"][0]  # the base's layer
    assert second["layers"] == first["layers"]  # the project layer, bit for bit
    assert second["config_digest"] == first["config_digest"]  # the image id
    again = json.loads(_run([*BUILDAH, "inspect", "--type", "image", SECOND_BUILD]).stdout)
    # What the store holds under each build's tag is what image.json says: the id is its config's own sha256.
    for image, written in ((image_build.inspect, first), (again, second)):
        assert "sha256:" + hashlib.sha256(image["Config"].encode()).hexdigest() == written["config_digest"]
        assert image["OCIv1"]["rootfs"]["diff_ids"] == written["layers"]
    assert again["Docker"]["config"]["Healthcheck"] == image_build.inspect["Docker"]["config"]["Healthcheck"]
    assert (out / "sbom.cdx.json").read_bytes() == (image_build.out / "sbom.cdx.json").read_bytes()
    assert (out / "build-info.json").read_bytes() == (image_build.out / "build-info.json").read_bytes()


def test_the_sbom_lists_every_installed_package_with_its_version_and_wheel_sha256(built):
    inside = json.loads(in_image(built, "cat", "/etc/magi2studio/sbom.cdx.json").stdout)
    assert (built.out / "sbom.cdx.json").read_text() == in_image(built, "cat", "/etc/magi2studio/sbom.cdx.json").stdout
    listed = {(c["purl"].split("/")[0], c["name"], c["version"]): c for c in inside["components"] if "purl" in c}
    python = in_image(built, "python3", "-c", "from importlib import metadata\nfor d in metadata.distributions(): "
                                              "print(d.metadata['Name'], d.version, sep='\\t')").stdout
    dpkg = in_image(built, "dpkg-query", "-W", "-f", "${db:Status-Abbrev}\t${Package}\t${Version}\n").stdout
    installed = {("pkg:pypi", *line.split("\t")) for line in python.splitlines()}
    installed |= {("pkg:deb", *line.split("\t")[1:]) for line in dpkg.splitlines() if line.startswith("ii")}
    assert set(listed) == installed
    unhashed = sorted(name for kind, name, _ in listed if kind == "pkg:pypi" and "hashes" not in listed[kind, name, _])
    assert unhashed == ["magi2studio"], unhashed  # built from the source tree; every other one came from a wheel
    base = next(c for c in inside["components"] if c["type"] == "container")
    assert (base["name"], base["version"]) == (contract.LOCAL_BASE, built.base_digest)
    counts = {kind: sum(1 for k, _, _ in listed if k == kind) for kind in ("pkg:pypi", "pkg:deb")}
    print(f"\nSBOM: {counts['pkg:pypi']} Python distributions, {counts['pkg:deb']} Debian packages", file=sys.stderr)


def test_builder_and_secrets_are_named_and_nothing_of_the_host_is_in_a_layer(built):
    assert "build-image: builder buildah" in built.build_log
    assert "secret cacert" in built.build_log
    # buildah leaves the read-only mounts' mount points behind as empty folders; nothing in them.
    folders = " ".join(line.split(": ", 1)[1] for line in built.build_log.splitlines()
                       if line.startswith("build-image: read-only mounts")).replace(",", "")
    assert folders, "the build mounted none of the pip configuration's folders"
    leaked = in_image(built, "bash", "-c", f"ls /run/secrets 2>/dev/null; grep -rls 'find-links' /etc 2>/dev/null; "
                                           f"find {folders} -mindepth 1 2>/dev/null | head -3")
    assert leaked.stdout.strip() == "", leaked.stdout
    # The image keeps Debian's own CA bundle: the host's (with the proxy's CA) went in as a secret.
    image_bundle = in_image(built, "sha256sum", "/etc/ssl/certs/ca-certificates.crt").stdout.split()[0]
    assert image_bundle != hashlib.sha256(Path("/etc/ssl/certs/ca-certificates.crt").read_bytes()).hexdigest()


def test_runs_as_10001_with_the_oci_labels_ports_and_env(built):
    config = built.inspect.get("Docker", {}).get("config") or {}
    oci = built.inspect["OCIv1"]["config"]
    assert oci["User"] == contract.USER
    assert in_image(built, "id", "-u").stdout.strip() == contract.USER.split(":")[0]
    assert f"{contract.STUDIO_PORT}/tcp" in oci["ExposedPorts"]
    env = dict(item.split("=", 1) for item in oci["Env"])
    assert {key: env.get(key) for key in contract.environment("cpu")} == contract.environment("cpu")
    assert env["PATH"].startswith("/opt/venv/bin:")
    assert oci["Entrypoint"] == ["magi2studio"]
    labels = oci["Labels"]
    assert set(contract.OCI_LABELS) <= set(labels), set(contract.OCI_LABELS) - set(labels)
    assert labels["org.opencontainers.image.revision"] == built.revision
    assert labels["org.opencontainers.image.base.digest"] == built.base_digest
    lock_sha256 = hashlib.sha256((ROOT / "image" / "lock.yaml").read_bytes()).hexdigest()
    assert labels["io.magi2studio.lock.sha256"] == lock_sha256
    assert config.get("Healthcheck", {}).get("Test"), "the docker-format image lost its HEALTHCHECK"


def test_build_info_matches_the_lock_revision_and_base(built):
    info = json.loads(in_image(built, "cat", "/etc/magi2studio/build-info.json").stdout)
    assert info["platform"] == "cpu" and info["git_revision"] == built.revision
    assert info["lock_sha256"] == hashlib.sha256((ROOT / "image" / "lock.yaml").read_bytes()).hexdigest()
    assert info["base_image"] == contract.LOCAL_BASE and info["base_image_digest"] == built.base_digest
    assert info["python"].startswith(contract.LOCK["python"] + ".")
    freeze = info["pip_freeze"]
    assert f"torch=={contract.LOCK['torch']['cpu']['version']}+cpu" in freeze
    assert f"vllm-omni=={contract.LOCK['vllm_omni']['version']}" in freeze
    assert [line for line in freeze if line.lower().startswith("nvidia")] == []


def test_the_cpu_image_is_small_and_has_few_layers(built):
    layers = built.inspect["OCIv1"]["rootfs"]["diff_ids"]
    size = _image_bytes(built)
    print(f"\nimage: {size / 1e9:.2f} GB, {len(layers)} layers", file=sys.stderr)
    assert size <= contract.IMAGE_MAX_BYTES
    assert len(layers) <= 3


def _image_bytes(built: Built) -> int:
    """The image's unpacked size (what `docker images` reports): the fresh working container's tree."""

    mount = _run([*BUILDAH, "mount", built.container]).stdout.strip()
    try:
        return int(_run(["du", "-sb", "--one-file-system", mount]).stdout.split()[0])
    finally:
        _run([*BUILDAH, "umount", built.container])


def test_doctor_runs_in_the_image(built, tmp_path):
    result = in_image(built, "magi2studio", "doctor", timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "platform: cpu" in result.stdout and f"git_revision={built.revision}" in result.stdout
    # The environment is the SBOM's, file by file (vLLM's dropped CUDA kernels expected gone).
    assert "drift: none: the environment equals the image's SBOM and lock" in result.stdout, result.stdout[-3000:]


def test_weights_check_names_a_broken_tree_file_by_file(built, tmp_path):
    tree = synthetic_tree(tmp_path / "MAGI-2-preview")
    # A download is readable by everyone; safetensors writes 0600 files, which uid 10001 cannot read.
    for path in [tree, *tree.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    mounts = {contract.WEIGHTS: (tree, True)}
    good = in_image(built, "magi2studio", "weights", "check", "--root", contract.WEIGHTS, "--tier", "1080p",
                    mounts=mounts, timeout=300)
    assert good.returncode == 0, good.stdout + good.stderr
    (tree / "vae" / "Wan2.2_VAE.pth").unlink()
    shard = next((tree / "preview").glob("model-00002-*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-16])
    bad = in_image(built, "magi2studio", "weights", "check", "--root", contract.WEIGHTS, "--tier", "1080p",
                   mounts=mounts, timeout=300)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "vae/Wan2.2_VAE.pth" in bad.stdout + bad.stderr and shard.name in bad.stdout + bad.stderr


def _outputs(tmp_path: Path) -> Path:
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    uid, gid = (int(part) for part in contract.USER.split(":"))
    os.chown(outputs, uid, gid)
    return outputs


def _only_run(outputs: Path) -> dict:
    from magi2studio.run_folder.runs import verify_run

    runs = [path for path in outputs.iterdir() if not path.name.startswith(".")]
    assert len(runs) == 1, runs
    return verify_run(runs[0]).manifest


def test_generate_in_the_image_equals_the_host_venv(built, tmp_path):
    request = ["generate", "--prompt", PROMPT, "--tier", "272p", "--seed", "7", "--steps", "8"]
    outputs = _outputs(tmp_path)
    inside = in_image(built, "magi2studio", *request, "--out", contract.OUTPUTS,
                      mounts={contract.OUTPUTS: (outputs, False)}, timeout=900)
    assert inside.returncode == 0, inside.stdout[-3000:] + inside.stderr[-3000:]
    host_out = tmp_path / "host"
    host_out.mkdir()
    default = {key: value for key, value in os.environ.items() if key != "MAGI2_EMBEDDED_WEIGHTS"}  # as in the image
    host = _run([str(Path(sys.executable).with_name("magi2studio")), *request, "--out", str(host_out)], timeout=900,
                env=default)
    assert host.returncode == 0, host.stdout[-3000:] + host.stderr[-3000:]
    from magi2studio.engines.embedded.tiny_weights import TRAINED_SHA256

    assert _only_run(outputs)["engine"]["weights_sha256"] == TRAINED_SHA256  # the image's default: the shipped one
    image_hashes, host_hashes = _only_run(outputs)["hashes"], _only_run(host_out)["hashes"]
    print(f"\nin image: frames {image_hashes['frames_sha256'][:12]} pcm {image_hashes['pcm_sha256'][:12]}; "
          f"host: frames {host_hashes['frames_sha256'][:12]} pcm {host_hashes['pcm_sha256'][:12]}", file=sys.stderr)
    assert (image_hashes["frames_sha256"], image_hashes["pcm_sha256"]) == \
        (host_hashes["frames_sha256"], host_hashes["pcm_sha256"])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return response.status == 200
    except OSError:
        return False


def test_studio_served_from_the_image_passes_the_browser_test(built, tmp_path):
    outputs = _outputs(tmp_path)
    # The image's own command; host networking has no port mapping, so a free port stands in
    # for compose's "7860:7860". --preload sp1-cfg1: the layout the browser test drives (as its
    # in-process fixture preloads).
    port = _free_port()
    command = [*built.inspect["OCIv1"]["config"]["Entrypoint"], *built.inspect["OCIv1"]["config"]["Cmd"],
               "--preload", "sp1-cfg1"]
    command[command.index("--port") + 1] = str(port)
    server = subprocess.Popen(
        [*BUILDAH, "run", "--isolation", "chroot", "--network", "host",
         f"--volume={outputs}:{contract.OUTPUTS}:rw", built.container, "--", *command],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 300
        while not _answers(url):
            assert server.poll() is None, "the studio in the image exited before answering"
            assert time.monotonic() < deadline, f"the studio in the image did not answer on {url} in 300 s"
            time.sleep(2)
        # The image's HEALTHCHECK probes readiness: the embedded engine can take a job at once.
        assert _answers(url + "health/live") and _answers(url + "health/ready")
        env = {**os.environ, "MAGI2STUDIO_URL": url, "MAGI2STUDIO_SCREENSHOTS": str(tmp_path / "shots")}
        browser = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(ROOT / "tests" / "studio" / "test_studio_browser.py")], env=env, cwd=ROOT, timeout=900)
        assert browser.returncode == 0, browser.stdout[-4000:] + browser.stderr[-2000:]
        assert "1 passed" in browser.stdout
        assert len([p for p in outputs.iterdir() if not p.name.startswith(".")]) >= 1
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
