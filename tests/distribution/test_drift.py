"""The drift check (magi2studio/drift.py) against an SBOM written by image/sbom.py: a real wheel
installed into a folder, then changed file by file; every difference is named, none is invented."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from magi2studio import doctor, drift

from .image_contract import ROOT

sys.path.insert(0, str(ROOT / "image"))
import sbom as image_sbom  # noqa: E402  (image/sbom.py, the build's own generator)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path, Path]:
    """PyYAML and tqdm installed with pip's report, as image/install.sh does; and the wheels pip took."""
    base = tmp_path_factory.mktemp("drift")
    prefix, reports, wheels = base / "prefix", base / "reports", base / "wheels"
    site = prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    reports.mkdir()
    for n, spec in enumerate(("pyyaml==6.0.3", "tqdm==4.70.1")):
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), spec],
                       check=True)
        wheel = next(w for w in wheels.glob("*.whl") if w.name.lower().startswith(spec.split("==")[0] + "-"))
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--ignore-installed",
                        "--prefix", str(prefix), "--no-warn-script-location",
                        "--report", str(reports / f"{n:02d}.json"), str(wheel)], check=True)
    return site, reports, wheels


def _sbom(site: Path, reports: Path) -> list[dict]:
    return image_sbom.python_components(reports, path=[str(site)])


def _check(components: list[dict], site: Path) -> drift.Drift:
    found = drift.Drift("test")
    drift.check_python(components, found, path=[str(site)])
    return found


def test_the_sbom_holds_each_wheels_sha256_and_the_untouched_install_has_no_drift(installed):
    site, reports, wheels = installed
    components = {c["name"]: c for c in _sbom(site, reports)}
    assert set(components) == {"PyYAML", "tqdm"}
    for name, component in components.items():
        wheel = next(w for w in wheels.glob("*.whl") if w.name.lower().startswith(name.lower()))
        assert component["hashes"] == [{"alg": "SHA-256", "content": hashlib.sha256(wheel.read_bytes()).hexdigest()}]
        assert component["version"] == wheel.name.split("-")[1]
    found = _check(list(components.values()), site)
    assert found.ok, found.differences
    assert found.distributions == 2 and found.files_checked > 20


def test_every_changed_missing_added_or_moved_file_and_version_is_named(installed, tmp_path):
    site, reports, _ = installed
    components = _sbom(site, reports)
    changed, gone = site / "yaml" / "constructor.py", site / "tqdm" / "cli.py"
    saved = {path: path.read_bytes() for path in (changed, gone)}
    try:
        changed.write_bytes(saved[changed] + b"\n# patched\n")
        gone.unlink()
        moved = [dict(c, version="6.0.2") if c["name"] == "PyYAML" else c for c in components]
        found = _check(moved, site)
        assert found.differences == ["PyYAML: version 6.0.3 installed, 6.0.2 in the SBOM",
                                     "tqdm: tqdm/cli.py is missing"]
        found = _check(components, site)
        assert found.differences == ["PyYAML: yaml/constructor.py differs from its RECORD sha256",
                                     "tqdm: tqdm/cli.py is missing"]
        # A file the build removed on purpose (vLLM's CUDA kernels on cpu) is expected gone.
        removed = [dict(c, properties=[*c["properties"], {"name": "magi2studio:removed_files", "value": "tqdm/cli.py"}])
                   if c["name"] == "tqdm" else c for c in components]
        assert _check(removed, site).differences == ["PyYAML: yaml/constructor.py differs from its RECORD sha256"]
        only_yaml = [c for c in components if c["name"] == "PyYAML"]
        assert "tqdm 4.70.1: installed, not in the SBOM" in _check(only_yaml, site).differences
        extra = [*components, {"name": "numpy", "version": "2.4.6", "purl": "pkg:pypi/numpy@2.4.6"}]
        assert "numpy 2.4.6: in the SBOM, not installed" in _check(extra, site).differences
    finally:
        for path, data in saved.items():
            path.write_bytes(data)
    assert _check(components, site).ok


def test_the_lock_pins_are_held_against_the_sbom():
    import yaml

    lock = yaml.safe_load((ROOT / "image" / "lock.yaml").read_text(encoding="utf-8"))
    pins = {"pip": lock["pip"], "magi2studio": lock["magi2studio"]["version"], "av": lock["ffmpeg"]["pyav"],
            "vllm-omni": lock["vllm_omni"]["version"], "vllm": lock["vllm"]["version"],
            "torch": lock["torch"]["cpu"]["version"] + "+cpu"}
    sbom = {"components": [{"name": k, "version": v, "purl": f"pkg:pypi/{k}@{v}"} for k, v in pins.items()]}
    found = drift.Drift("test")
    drift.check_lock(lock, sbom, found, "cpu")
    assert found.ok, found.differences
    sbom["components"][-1]["version"] = "2.12.0+cpu"
    drift.check_lock(lock, sbom, found, "cpu")
    assert found.differences == [f"torch: 2.12.0+cpu in the SBOM, {lock['torch']['cpu']['version']} in image/lock.yaml"]


def test_doctor_says_drift_is_not_checked_outside_the_image_and_names_differences_inside(tmp_path):
    assert drift.check(tmp_path / "no-sbom.json") is None
    assert doctor.render_drift(None)[0].startswith("drift: not checked (no SBOM at")
    sbom_path = tmp_path / "sbom.cdx.json"
    sbom_path.write_text(json.dumps({"components": [{"name": "no-such-dist", "version": "1.0",
                                                     "purl": "pkg:pypi/no-such-dist@1.0"}]}))
    found = drift.check(sbom_path, lock_path=None, path=[str(tmp_path)], debian=False)
    assert not found.ok and found.differences == ["no-such-dist 1.0: in the SBOM, not installed"]
    lines = doctor.render_drift(found.as_dict())
    assert lines[0].startswith("drift: 1 difference(s)")
    assert lines[1] == "  no-such-dist 1.0: in the SBOM, not installed"


def test_a_vendored_copy_on_sys_path_is_not_a_distribution_of_its_own(installed, tmp_path, monkeypatch):
    """setuptools, once imported, appends its _vendor folder to sys.path (doctor in the image saw nine
    'installed, not in the SBOM'); only the site folders hold what pip installed."""
    site, reports, _ = installed
    vendor = tmp_path / "site-packages" / "setuptools" / "_vendor"
    (vendor / "wheel-0.46.3.dist-info").mkdir(parents=True)
    (vendor / "wheel-0.46.3.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: wheel\nVersion: 0.46.3\n")
    monkeypatch.setattr(sys, "path", [str(site), str(vendor)])
    found = drift.Drift("test")
    drift.check_python(_sbom(site, reports), found)
    assert found.ok, found.differences


def _sbom_with_lock_sha256(tmp_path: Path, lock_bytes: bytes) -> Path:
    sbom_path = tmp_path / "sbom.cdx.json"
    sbom_path.write_text(json.dumps({"metadata": {"properties": [
        {"name": "magi2studio:lock_sha256", "value": hashlib.sha256(lock_bytes).hexdigest()}]}, "components": []}))
    return sbom_path


def test_a_lock_edited_outside_its_pins_or_gone_is_drift(tmp_path):
    """The image's lock is the one the SBOM recorded (its sha256), not only the six pins check_lock reads;
    a lock that is gone is not a clean verdict."""
    built = (ROOT / "image" / "lock.yaml").read_bytes()
    sbom_path, lock_path = _sbom_with_lock_sha256(tmp_path, built), tmp_path / "lock.yaml"

    def about_the_lock() -> list[str]:
        found = drift.check(sbom_path, lock_path=lock_path, path=[str(tmp_path)], debian=False)
        return [line for line in found.differences if line.startswith(str(lock_path))]

    lock_path.write_bytes(built)
    assert about_the_lock() == []
    lock_path.write_bytes(built.replace(b"revision: 2dea51b", b"revision: 0000000"))  # the weights' snapshot
    assert about_the_lock() == [f"{lock_path}: sha256 {hashlib.sha256(lock_path.read_bytes()).hexdigest()}, "
                                f"{hashlib.sha256(built).hexdigest()} in the SBOM (the lock the image was built from)"]
    lock_path.unlink()
    assert about_the_lock() == [f"{lock_path}: missing (the lock the image was built from)"]


def test_a_second_check_sees_a_file_rewritten_in_place_with_its_size_and_mtime_kept(installed):
    """The Environment tab's Refresh re-checks in the same process: the hash cache must not take an
    in-place rewrite that keeps the size and resets the mtime (os.utime) for the file it read before."""
    site, reports, _ = installed
    components = _sbom(site, reports)
    target = site / "yaml" / "constructor.py"
    saved = target.read_bytes()
    before = target.stat()
    assert _check(components, site).ok
    try:
        time.sleep(0.05)  # the ctime the rewrite sets is a later tick than the one the first check saw
        with target.open("r+b") as handle:
            handle.write(b"#" if saved[:1] != b"#" else b"X")
        os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = target.stat()
        assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
        assert _check(components, site).differences == ["PyYAML: yaml/constructor.py differs from its RECORD sha256"]
    finally:
        target.write_bytes(saved)
    assert _check(components, site).ok


def test_a_distribution_folder_without_a_name_is_a_difference_not_a_traceback(installed, tmp_path):
    """A stray .dist-info folder (an interrupted uninstall leaves one) has no METADATA Name: doctor named
    nothing and stopped with a TypeError."""
    site, reports, _ = installed
    components = _sbom(site, reports)
    stray = tmp_path / "site-packages"
    (stray / "broken-1.0.dist-info").mkdir(parents=True)
    found = drift.Drift("test")
    drift.check_python(components, found, path=[str(site), str(stray)])
    assert found.differences == [f"a distribution in {stray} has no Name in its metadata (a stray or broken "
                                 ".dist-info folder)"]


@pytest.mark.parametrize("text", ["schema: 1\n", "pip: [unclosed\n", "- a list\n"])
def test_a_lock_that_cannot_be_read_is_a_difference_not_a_traceback(tmp_path, text):
    """doctor (and the Environment tab) named nothing and stopped with a KeyError or a YAML error."""
    sbom_path, lock_path = _sbom_with_lock_sha256(tmp_path, text.encode()), tmp_path / "lock.yaml"
    lock_path.write_text(text)
    found = drift.check(sbom_path, lock_path=lock_path, path=[str(tmp_path)], debian=False)
    assert len(found.differences) == 1 and found.differences[0].startswith(f"{lock_path}: cannot be read ("), \
        found.differences
    assert "\n" not in found.differences[0]  # doctor prints one difference a line


def test_a_file_changed_with_its_record_rewritten_to_match_is_drift(installed):
    """RECORD lives beside the files it vouches for: a reinstall of another build of the same version
    (pip rewrites RECORD) or an edit of both passed as 'drift: none'. The SBOM holds each RECORD's sha256."""
    site, reports, _ = installed
    components = _sbom(site, reports)
    target = site / "yaml" / "constructor.py"
    record = next(site.glob("[Pp]y[Yy][Aa][Mm][Ll]-*.dist-info")) / "RECORD"
    saved = {path: path.read_bytes() for path in (target, record)}
    try:
        patched = saved[target] + b"\n# patched\n"
        target.write_bytes(patched)
        new_hash = base64.urlsafe_b64encode(hashlib.sha256(patched).digest()).rstrip(b"=").decode()
        row_of_target = f"yaml/constructor.py,sha256={new_hash},{len(patched)}"
        rows = [row_of_target if row.startswith("yaml/constructor.py,") else row
                for row in saved[record].decode().splitlines()]
        record.write_text("\n".join(rows) + "\n")
        assert _check(components, site).differences == [
            "PyYAML: its RECORD differs from the one the image was built with (a reinstall or an edit; "
            "its files were checked against the new one)"]
    finally:
        for path, data in saved.items():
            path.write_bytes(data)
    assert _check(components, site).ok


@pytest.mark.parametrize("document", [[], {"components": {"a": 1}}, {"components": [{"purl": "pkg:pypi/x@1"}]},
                                      {"components": [], "metadata": []}])
def test_an_sbom_of_another_shape_is_a_difference_not_a_traceback(tmp_path, document):
    """Valid JSON that is not the SBOM image/sbom.py writes: doctor stopped with an AttributeError or a KeyError."""
    sbom_path = tmp_path / "sbom.cdx.json"
    sbom_path.write_text(json.dumps(document))
    found = drift.check(sbom_path, lock_path=None, path=[str(tmp_path)], debian=False)
    assert not found.ok and found.differences[0].startswith("the SBOM cannot be read ("), found.differences


def test_a_missing_sbom_inside_the_image_is_a_difference_not_not_checked(tmp_path):
    """Outside the image there is no SBOM ('not checked'); in it (build-info.json is there) an SBOM that is gone
    was also 'not checked (not running in the magi2studio image)', which the image was."""
    build_info = tmp_path / "build-info.json"
    assert drift.check(tmp_path / "no-sbom.json", build_info_path=build_info) is None
    build_info.write_text("{}")
    found = drift.check(tmp_path / "no-sbom.json", build_info_path=build_info, debian=False)
    assert found.differences == [f"the SBOM {tmp_path / 'no-sbom.json'} is missing, though this is the magi2studio "
                                 f"image ({build_info} is there)"]


def test_a_record_row_without_a_sha256_is_checked_or_named_never_skipped(installed):
    """A RECORD row with another algorithm's hash, or none, for a file that is not byte code nor RECORD itself
    was skipped: the file was neither checked nor counted, and the verdict could be 'none'."""
    site, reports, _ = installed
    target = site / "yaml" / "constructor.py"
    record = next(site.glob("[Pp]y[Yy][Aa][Mm][Ll]-*.dist-info")) / "RECORD"
    saved = {path: path.read_bytes() for path in (target, record)}

    def with_row(row_of_target: str) -> None:
        record.write_text("\n".join(row_of_target if row.startswith("yaml/constructor.py,") else row
                                    for row in saved[record].decode().splitlines()) + "\n")

    sha512 = base64.urlsafe_b64encode(hashlib.sha512(saved[target]).digest()).rstrip(b"=").decode()
    components = [{k: v for k, v in c.items() if k != "properties"} for c in _sbom(site, reports)]
    try:
        checked_before = _check(components, site).files_checked
        with_row(f"yaml/constructor.py,sha512={sha512},{len(saved[target])}")
        found = _check(components, site)
        assert found.ok and found.files_checked == checked_before, found.differences
        target.write_bytes(saved[target] + b"\n# patched\n")
        assert _check(components, site).differences == ["PyYAML: yaml/constructor.py differs from its RECORD sha512"]
        with_row(f"yaml/constructor.py,,{len(saved[target])}")
        assert _check(components, site).differences == [
            "PyYAML: yaml/constructor.py has no hash in its RECORD (cannot verify it)"]
    finally:
        for path, data in saved.items():
            path.write_bytes(data)
    assert _check(components, site).ok


def test_a_file_added_to_a_site_folder_outside_every_record_is_drift(installed, tmp_path):
    """A .pth line runs at every start; no RECORD lists an added one, so every RECORD check passed it."""
    site, reports, _ = installed
    sbom_path = tmp_path / "sbom.cdx.json"
    sbom_path.write_text(json.dumps({"components": _sbom(site, reports), "metadata": {"properties": [
        {"name": "magi2studio:unrecorded_files", "value": "\n".join(drift.unrecorded_files([str(site)]))}]}}))
    assert drift.check(sbom_path, lock_path=None, path=[str(site)], debian=False).ok
    added = site / "zz-added.pth"
    try:
        added.write_text("import os\n")
        (site / "yaml" / "__pycache__").mkdir(exist_ok=True)  # byte code caches are not counted
        found = drift.check(sbom_path, lock_path=None, path=[str(site)], debian=False)
        assert found.differences == [f"{added}: in a site folder but in no RECORD, and not there when the image "
                                     "was built"]
    finally:
        added.unlink()
    assert drift.check(sbom_path, lock_path=None, path=[str(site)], debian=False).ok


def test_a_multi_arch_debian_package_is_checked_per_architecture(monkeypatch):
    """Keyed by name only, libc6:amd64 and libc6:i386 collapsed into one entry, so a changed version of one of
    them could pass as the other's."""
    def deb(name, version, arch):
        purl = f"pkg:deb/debian/{name}@{version}?arch={arch}"
        return {"type": "library", "name": name, "version": version, "purl": purl, "bom-ref": purl}

    sbom = [deb("libc6", "2.36-9", "amd64"), deb("libc6", "2.36-9", "i386"), deb("tzdata", "2025b", "all")]
    installed = "ii \tlibc6\t2.36-9\tamd64\nii \tlibc6\t2.36-9+evil\ti386\nii \ttzdata\t2025b\tall\n"
    monkeypatch.setattr(drift.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, installed, ""))
    found = drift.Drift(sbom="sbom.cdx.json")
    drift.check_debian(sbom, found)
    assert found.differences == ["Debian libc6:i386: version 2.36-9+evil installed, 2.36-9 in the SBOM"]
    assert found.debian_packages == 3


def _sbom_file(site: Path, reports: Path, tmp_path: Path) -> Path:
    sbom_path = tmp_path / "sbom.cdx.json"
    sbom_path.write_text(json.dumps({"components": _sbom(site, reports), "metadata": {"properties": [
        {"name": "magi2studio:unrecorded_files", "value": "\n".join(drift.unrecorded_files([str(site)]))}]}}))
    return sbom_path


@pytest.mark.parametrize("spread", [False, True], ids=["in-process", "worker-processes"])
def test_an_edited_pyc_that_keeps_its_source_hash_runs_changed_code_and_is_drift(installed, tmp_path, monkeypatch,
                                                                                 spread):
    """The image compiles checked-hash .pyc after install (no RECORD lists them) and import checks only the source
    hash in the header: byte code edited under the same header ran other code with 'drift: none'. A first check
    of a whole image spreads its compiles over worker processes; both ways name the same."""
    import compileall
    import importlib.util
    import marshal
    import py_compile
    import shutil

    if spread:
        monkeypatch.setattr(drift, "_SPREAD_FROM", 1)
        monkeypatch.setattr(drift.os, "cpu_count", lambda: 3)
        workers = []
        monkeypatch.setattr(drift, "_bytecode_verdict", lambda *item: workers.append(item) or (False, None))
    site, reports, _ = installed
    sbom_path = _sbom_file(site, reports, tmp_path)
    source = site / "yaml" / "__init__.py"
    pyc = Path(importlib.util.cache_from_source(str(source)))
    try:
        assert compileall.compile_dir(str(site), quiet=1, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
        built = drift.check(sbom_path, lock_path=None, path=[str(site)], debian=False)
        assert built.ok and built.bytecode_checked > 20, built.differences  # the build's own byte code passes
        if spread:
            assert workers == [], workers  # every verdict came from the workers, none from this process
        header = pyc.read_bytes()[:16]
        evil = compile(source.read_text().replace("__version__ = '6.0.3'", "__version__ = 'changed'"), str(source),
                       "exec", dont_inherit=True)
        pyc.write_bytes(header + marshal.dumps(evil))
        ran = subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); "
                              "import yaml; print(yaml.__version__)"], capture_output=True, text=True, check=True)
        assert ran.stdout.strip() == "changed"  # what the edited byte code does, the source untouched
        found = drift.check(sbom_path, lock_path=None, path=[str(site)], debian=False)
        assert found.differences == [f"{pyc}: its code differs from its source __init__.py, and Python runs it in "
                                     "the source's place (its header matches the source)"]
        # A stale .pyc (its header names another source) is not loaded, so not a difference.
        pyc.write_bytes(header[:8] + bytes(8) + marshal.dumps(evil))
        assert drift.check(sbom_path, lock_path=None, path=[str(site)], debian=False).ok
    finally:
        for cache in list(site.rglob("__pycache__")):
            shutil.rmtree(cache)
    assert drift.check(sbom_path, lock_path=None, path=[str(site)], debian=False).ok


def test_gradios_hash_seed_written_at_run_time_is_not_drift_and_other_files_are(installed, tmp_path):
    """Gradio writes gradio/hash_seed.txt into its own folder at its first start where it may (a root container):
    a seed for its cache file names, which drift named as an added file."""
    site, reports, _ = installed
    sbom_path = _sbom_file(site, reports, tmp_path)
    seed, other = site / "gradio" / "hash_seed.txt", site / "gradio" / "other.txt"
    try:
        seed.parent.mkdir()
        seed.write_text("0123456789abcdef")
        assert drift.check(sbom_path, lock_path=None, path=[str(site)], debian=False).ok
        other.write_text("x")
        assert drift.check(sbom_path, lock_path=None, path=[str(site)], debian=False).differences == [
            f"{other}: in a site folder but in no RECORD, and not there when the image was built"]
    finally:
        for path in (seed, other):
            path.unlink(missing_ok=True)
        seed.parent.rmdir()


def test_a_worker_that_fails_leaves_its_share_to_the_caller(installed, monkeypatch, tmp_path):
    """A worker process that cannot start its check (here: an interpreter that exits at once) must not fail or
    shorten the verdict: its share is checked in the calling process."""
    import compileall
    import py_compile
    import shutil

    site, _, _ = installed
    monkeypatch.setattr(drift, "_SPREAD_FROM", 1)
    monkeypatch.setattr(drift.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(drift.sys, "executable", "/bin/false")
    try:
        assert compileall.compile_dir(str(site), quiet=1, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
        expected = len(list(site.rglob("*.pyc")))
        drift._BYTECODE.clear()
        checked, found = drift.bytecode_differences([str(site)])
        assert (checked, found) == (expected, [])
    finally:
        for cache in list(site.rglob("__pycache__")):
            shutil.rmtree(cache)
