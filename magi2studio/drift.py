"""Drift: does the running environment still equal the image's bill of materials and the lock?

Inside the image, ``/etc/magi2studio/sbom.cdx.json`` (image/sbom.py) lists every Python
distribution and Debian package the build installed. This names every difference: a
distribution missing, added or at another version; a file whose bytes no longer match the
sha256 its RECORD holds (pip wrote it at install), or that is gone; a RECORD other than the one
whose sha256 the SBOM holds (a reinstall of another build of the same version rewrites it); a
Debian package changed; the lock (image/lock.yaml in the image's source tree) against the sha256
the SBOM records for it, and its pins against what is installed; a file in a site folder that no
RECORD lists and the build did not leave (a ``.pth`` runs at every start); a byte code file Python would
load in place of its source (a ``__pycache__`` .pyc whose header matches the source) whose code is not the
source's (an edited .pyc that keeps its source hash runs changed code).
``magi2studio doctor`` reports it and the studio's Environment tab shows the verdict. Over 300 lines: one check a
section (distributions, site folders, byte code, Debian, the lock), each beside how it reads what it checks.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import importlib.util
import json
import marshal
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from .run_folder import provenance

SBOM_PATH = Path(os.environ.get("MAGI2STUDIO_SBOM", "/etc/magi2studio/sbom.cdx.json"))
LOCK_PATH = Path(os.environ.get("MAGI2STUDIO_LOCK", "/opt/magi2studio/src/image/lock.yaml"))
# (path, size, mtime_ns, ctime_ns, inode, algorithm) -> digest of a file already read in this process: a
# second check (the Environment tab's Refresh) reads only what changed on disk. The ctime too: a rewrite
# can keep the size and set the mtime back (os.utime), but no write leaves the ctime as it was.
_HASHED: dict[tuple[str, int, int, int, int, str], str] = {}


@dataclass
class Drift:
    sbom: str
    distributions: int = 0
    files_checked: int = 0
    bytecode_checked: int = 0
    debian_packages: int = 0
    differences: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences

    def as_dict(self) -> dict[str, Any]:
        return {"sbom": self.sbom, "ok": self.ok, "distributions": self.distributions,
                "files_checked": self.files_checked, "bytecode_checked": self.bytecode_checked,
                "debian_packages": self.debian_packages,
                "differences": self.differences}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _digest_b64(path: Path, algorithm: str) -> str:
    """The file's digest as RECORD writes it (urlsafe base64, no padding)."""
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, algorithm)
    if key not in _HASHED:
        digest = hashlib.new(algorithm)
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _HASHED[key] = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    return _HASHED[key]


# Rows RECORD may leave without a hash: itself and its signatures, and byte code (pip's spec allows it).
_UNHASHED_NAMES = ("RECORD", "RECORD.jws", "RECORD.p7s")
# The wheel spec's hashes: sha256 or stronger (md5 and sha1 are refused, so they are not verified here).
_RECORD_ALGORITHMS = ("sha224", "sha256", "sha384", "sha512", "sha3_256", "sha3_384", "sha3_512", "blake2b",
                      "blake2s")


def record_differences(dist: metadata.Distribution, expected_gone: set[str]) -> tuple[int, list[str]]:
    """Each file of the distribution's RECORD that is gone, differs from its hash, or has none; (checked, findings)."""
    text = dist.read_text("RECORD")
    if text is None:
        return 0, [f"{dist.metadata['Name']}: no RECORD file (cannot verify its files)"]
    base = Path(dist.locate_file(""))
    checked, found = 0, []
    for row in csv.reader(io.StringIO(text)):
        if not row or row[0] in expected_gone:
            continue
        relative = row[0]
        algorithm, _, want = (row[1] if len(row) > 1 else "").partition("=")
        if not want:
            if not (relative.endswith(".pyc") or Path(relative).name in _UNHASHED_NAMES):
                found.append(f"{dist.metadata['Name']}: {relative} has no hash in its RECORD (cannot verify it)")
            continue
        path = base / relative
        checked += 1
        if not path.is_file():
            found.append(f"{dist.metadata['Name']}: {relative} is missing")
        elif algorithm not in _RECORD_ALGORITHMS:
            found.append(f"{dist.metadata['Name']}: {relative} has a {algorithm} hash in its RECORD (cannot verify it)")
        elif _digest_b64(path, algorithm) != want:
            found.append(f"{dist.metadata['Name']}: {relative} differs from its RECORD {algorithm}")
    return checked, found


def _property(component: dict, name: str) -> str:
    return next((p["value"] for p in component.get("properties", []) if p["name"] == name), "")


def site_dirs() -> list[str]:
    """The site folders on sys.path: what pip installed into (the venv's; cuda/musa also the base's).

    Not every sys.path entry: setuptools, once imported, appends its ``_vendor`` folder, whose
    vendored copies are setuptools' files (its RECORD holds them), not distributions of their own.
    """
    return [entry for entry in sys.path if Path(entry).name in ("site-packages", "dist-packages")]


def check_python(components: list[dict], drift: Drift, path: list[str] | None = None) -> None:
    installed: dict[str, metadata.Distribution] = {}
    for dist in metadata.distributions(path=site_dirs() if path is None else path):
        if not dist.metadata["Name"]:
            drift.differences.append(f"a distribution in {dist.locate_file('')} has no Name in its metadata "
                                     "(a stray or broken .dist-info folder)")
            continue
        installed.setdefault(canonical(dist.metadata["Name"]), dist)
    listed = {canonical(c["name"]): c for c in components if c.get("purl", "").startswith("pkg:pypi/")}
    drift.distributions = len(listed)
    for key in sorted(set(installed) - set(listed)):
        drift.differences.append(f"{installed[key].metadata['Name']} {installed[key].version}: installed, "
                                 "not in the SBOM")
    for key, component in sorted(listed.items()):
        dist = installed.get(key)
        if dist is None:
            drift.differences.append(f"{component['name']} {component['version']}: in the SBOM, not installed")
            continue
        if dist.version != component["version"]:
            drift.differences.append(f"{component['name']}: version {dist.version} installed, "
                                     f"{component['version']} in the SBOM")
            continue
        built_record = _property(component, "magi2studio:record_sha256")
        record = dist.read_text("RECORD")
        if built_record and record is not None and hashlib.sha256(record.encode("utf-8")).hexdigest() != built_record:
            drift.differences.append(f"{component['name']}: its RECORD differs from the one the image was built with "
                                     "(a reinstall or an edit; its files were checked against the new one)")
        gone = set(_property(component, "magi2studio:removed_files").split())
        checked, found = record_differences(dist, gone)
        drift.files_checked += checked
        drift.differences += found


# Files a distribution writes into its own folder at run time, by their path in the site folder: Gradio's
# hash_seed.txt (gradio.utils.HASH_SEED_PATH), a random seed for its cache file names written at its first
# start where it may write there (a root container). Data, not code.
RUNTIME_FILES = ("gradio/hash_seed.txt",)


def unrecorded_files(sites: list[str]) -> list[str]:
    """Every file in the site folders that no distribution's RECORD lists, byte code caches and RUNTIME_FILES aside.

    Python runs some of these at start (a ``.pth`` line, ``sitecustomize.py``); no RECORD vouches for them,
    so the SBOM lists the ones the build left (image/sbom.py) and a new one is drift.
    """
    listed = {os.path.normpath(dist.locate_file(file)) for dist in metadata.distributions(path=sites)
              for file in dist.files or ()}
    found = []
    for site in sites:
        listed |= {os.path.normpath(os.path.join(site, name)) for name in RUNTIME_FILES}
        for folder, subfolders, names in os.walk(site):
            subfolders[:] = sorted(name for name in subfolders if name != "__pycache__")
            found += [path for name in names if (path := os.path.normpath(os.path.join(folder, name))) not in listed]
    return sorted(found)


def check_unrecorded(sbom: dict, drift: Drift, path: list[str] | None = None) -> None:
    """Files in the site folders in no RECORD that the build did not leave (the SBOM lists those it did)."""
    built = next((p["value"] for p in sbom.get("metadata", {}).get("properties", [])
                  if p.get("name") == "magi2studio:unrecorded_files"), None)
    if built is None:
        return  # an SBOM from before the list was kept
    for added in sorted(set(unrecorded_files(site_dirs() if path is None else path)) - set(built.splitlines())):
        drift.differences.append(f"{added}: in a site folder but in no RECORD, and not there when the image was built")


# (pyc, its stat, its source's stat) -> (loaded in place of the source, finding): a first check compiles every
# source (2 to 5 ms a file), a Refresh only what changed.
_BYTECODE: dict[tuple, tuple[bool, str | None]] = {}


def _loaded_in_place_of_source(header: bytes, source_stat: os.stat_result, source_bytes: bytes) -> bool:
    """Whether import runs this .pyc rather than compile its source: importlib's own checks of the header."""
    flags = int.from_bytes(header[4:8], "little")
    if flags == 0:  # stamped with the source's mtime and size
        return (header[8:12] == (int(source_stat.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
                and header[12:16] == (source_stat.st_size & 0xFFFFFFFF).to_bytes(4, "little"))
    if flags == 0b11:  # checked hash (the image's compileall): loaded while the source's hash matches
        return header[8:16] == importlib.util.source_hash(source_bytes)
    return flags == 0b01  # unchecked hash: loaded whatever the source holds; any other flag is refused


def _bytecode_verdict(pyc: str, source: str, optimize: int) -> tuple[bool, str | None]:
    """(loaded in place of the source, the finding or None) for one ``__pycache__`` file."""
    data, source_bytes = Path(pyc).read_bytes(), Path(source).read_bytes()
    if len(data) < 16 or data[:4] != importlib.util.MAGIC_NUMBER or not _loaded_in_place_of_source(
            data[:16], os.stat(source), source_bytes):
        return False, None  # import refuses it and compiles the source
    try:
        code = marshal.loads(data[16:])
    except (EOFError, ValueError, TypeError):
        return True, f"{pyc}: its header matches {Path(source).name} but it is not readable byte code (importing fails)"
    try:
        want = compile(source_bytes, source, "exec", dont_inherit=True, optimize=optimize)
    except (SyntaxError, ValueError, RecursionError):
        return True, f"{pyc}: byte code run in place of {Path(source).name}, which does not compile"
    if code != want:
        return True, (f"{pyc}: its code differs from its source {Path(source).name}, and Python runs it in the "
                      "source's place (its header matches the source)")
    return True, None


def _stat_key(path: str) -> tuple[int, int, int, int]:
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino


# A first check spreads its compiles over this many worker processes at most, past _SPREAD_FROM files.
_MOST_WORKERS = 16
_SPREAD_FROM = 1000


def _verdicts_on_every_cpu(todo: list[tuple[str, str, int]]) -> list[tuple[bool, str | None]]:
    """Each item's verdict; a first check of a whole image (21,222 files) spread over ``python -c`` workers.

    Plain subprocesses, not multiprocessing's spawn (it re-runs the caller's main script). A worker that fails
    leaves its share to this process. No warnings filter around the compiles: it is process-wide, and the studio
    checks from a worker thread.
    """
    workers = min(os.cpu_count() or 1, _MOST_WORKERS)
    if workers < 2 or len(todo) < _SPREAD_FROM:
        return [_bytecode_verdict(*item) for item in todo]
    shares = [todo[n::workers] for n in range(workers)]
    package_root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (package_root, os.environ.get("PYTHONPATH"))))}
    procs = [subprocess.Popen([sys.executable, "-c", "from magi2studio import drift; drift._bytecode_worker()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                              text=True) for _ in shares]
    for proc, share in zip(procs, shares, strict=True):  # each reads its whole share before it compiles
        try:
            with proc.stdin:
                json.dump(share, proc.stdin)
        except OSError:  # a worker that ended early (BrokenPipeError): its share is done here below
            pass
    done: list[list[tuple[bool, str | None]]] = []
    for proc, share in zip(procs, shares, strict=True):
        out = proc.stdout.read()
        proc.stdout.close()
        try:
            verdicts = [tuple(verdict) for verdict in json.loads(out)] if proc.wait() == 0 else None
        except ValueError:
            verdicts = None
        done.append(verdicts if verdicts and len(verdicts) == len(share) else
                    [_bytecode_verdict(*item) for item in share])
    return [done[n % workers][n // workers] for n in range(len(todo))]


def _bytecode_worker() -> None:
    """One worker of _verdicts_on_every_cpu: items as JSON on stdin, their verdicts as JSON on stdout."""
    json.dump([_bytecode_verdict(*item) for item in json.load(sys.stdin)], sys.stdout)


def bytecode_differences(sites: list[str]) -> tuple[int, list[str]]:
    """Each ``__pycache__`` .pyc of this Python that import would run in place of its source, against a compile
    of that source: (checked, findings).

    RECORD holds no byte code (the image compiles it after install), and a checked-hash .pyc is only checked
    against its source's hash: an edited one that keeps it runs other code. A .pyc import would not load (a
    stale one, another Python's) runs nothing and is not a difference; one a root container writes is its
    source's compile and passes.
    """
    name_pattern = re.compile(rf"[^.]+\.{re.escape(sys.implementation.cache_tag)}(?:\.opt-([12]))?\.pyc")
    items: list[tuple[tuple, tuple[str, str, int]]] = []
    for site in sites:
        for folder, subfolders, names in os.walk(site):
            subfolders.sort()
            if os.path.basename(folder) != "__pycache__":
                continue
            for name in sorted(names):
                matched = name_pattern.fullmatch(name)
                pyc = os.path.join(folder, name)
                source = importlib.util.source_from_cache(pyc) if matched else ""
                if not source or not os.path.isfile(source):
                    continue  # import loads no __pycache__ byte code without its source
                items.append(((pyc, *_stat_key(pyc), *_stat_key(source)), (pyc, source, int(matched.group(1) or 0))))
    todo = [item for key, item in items if key not in _BYTECODE]
    computed = dict(zip(todo, _verdicts_on_every_cpu(todo), strict=True))
    checked, found = 0, []
    for key, item in items:
        if key not in _BYTECODE:
            _BYTECODE[key] = computed[item]
        loaded, finding = _BYTECODE[key]
        checked += loaded
        found += [finding] if finding else []
    return checked, found


def check_bytecode(drift: Drift, path: list[str] | None = None) -> None:
    drift.bytecode_checked, found = bytecode_differences(site_dirs() if path is None else path)
    drift.differences += found


def _deb_arch(purl: str) -> str:
    """The ``arch`` qualifier of a ``pkg:deb`` purl (image/sbom.py writes one for every package), or ''."""
    query = purl.partition("?")[2]
    return next((value for key, _, value in (part.partition("=") for part in query.split("&")) if key == "arch"), "")


def check_debian(components: list[dict], drift: Drift) -> None:
    """Each package by name and architecture: a multi-arch package (libc6:amd64 and libc6:i386) is two entries,
    so a change in either is seen."""
    debs = [c for c in components if c.get("purl", "").startswith("pkg:deb/")]
    if not debs:
        return
    listed = {f"{c['name']}:{_deb_arch(c['purl'])}": c["version"] for c in debs}
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f",
                              "${db:Status-Abbrev}\t${Package}\t${Version}\t${Architecture}\n"],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        drift.differences.append(f"Debian packages: cannot list them ({err.__class__.__name__})")
        return
    installed = {f"{name}:{arch}": version for status, name, version, arch in
                 (line.split("\t") for line in out.splitlines()) if status.startswith("ii")}
    drift.debian_packages = len(listed)
    for name in sorted(set(listed) | set(installed)):
        want, have = listed.get(name), installed.get(name)
        if want != have:
            drift.differences.append(f"Debian {name}: " + (f"{have} installed, not in the SBOM" if want is None else
                                     f"in the SBOM ({want}), not installed" if have is None else
                                     f"version {have} installed, {want} in the SBOM"))


def check_lock(lock: dict, sbom: dict, drift: Drift, platform: str) -> None:
    """The lock's own pins against the SBOM (which check_python holds to what is installed)."""
    versions = {canonical(c["name"]): c["version"] for c in sbom["components"]
                if c.get("purl", "").startswith("pkg:pypi/")}
    pins = {"pip": lock.get("pip"), "magi2studio": lock["magi2studio"]["version"], "av": lock["ffmpeg"]["pyav"],
            "vllm-omni": lock["vllm_omni"]["version"]}
    if platform in ("cpu", "cuda"):
        pins |= {"vllm": lock["vllm"]["version"], "torch": lock["torch"][platform]["version"]}
    if platform == "musa":
        pins["torchada"] = lock["torchada"]["version"]
    for name, pin in pins.items():
        have = versions.get(name)
        # torch's local version (+cpu) is the wheel's build, not another release.
        if pin and (have or "").split("+")[0] != str(pin):
            drift.differences.append(f"{name}: {have or 'absent'} in the SBOM, {pin} in image/lock.yaml")


def _shape_problem(sbom: Any) -> str | None:
    """What keeps the checks from reading this document as image/sbom.py writes it, or None."""
    if not isinstance(sbom, dict) or not isinstance(sbom.get("metadata", {}), dict):
        return "not a CycloneDX document with a metadata object"
    components = sbom.get("components", [])
    if not isinstance(components, list) or not all(isinstance(c, dict) for c in components):
        return "its components are not a list of objects"
    for component in components:
        if str(component.get("purl", "")).startswith(("pkg:pypi/", "pkg:deb/")) and not (
                isinstance(component.get("name"), str) and isinstance(component.get("version"), str)):
            return f"component {component.get('purl')} has no name or version"
    return None


def check(sbom_path: Path = SBOM_PATH, lock_path: Path | None = LOCK_PATH,
          path: list[str] | None = None, debian: bool = True,
          build_info_path: Path = provenance.BUILD_INFO_PATH) -> Drift | None:
    """The drift verdict, or None where there is no SBOM and no build info (not running in the magi2studio image)."""
    try:
        sbom = json.loads(sbom_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if build_info_path.is_file():  # the image, which writes both: its SBOM is gone
            return Drift(str(sbom_path), differences=[f"the SBOM {sbom_path} is missing, though this is the "
                                                      f"magi2studio image ({build_info_path} is there)"])
        return None
    except (OSError, ValueError) as err:
        return Drift(str(sbom_path), differences=[f"the SBOM cannot be read ({err.__class__.__name__}: {err})"])
    problem = _shape_problem(sbom)
    if problem:
        return Drift(str(sbom_path), differences=[f"the SBOM cannot be read ({problem})"])
    drift = Drift(str(sbom_path))
    components = sbom.get("components", [])
    check_python(components, drift, path)
    check_unrecorded(sbom, drift, path)
    check_bytecode(drift, path)
    if debian:
        check_debian(components, drift)
    if lock_path is not None:
        built_from = _property(sbom.get("metadata", {}), "magi2studio:lock_sha256")
        if not lock_path.is_file():
            drift.differences.append(f"{lock_path}: missing (the lock the image was built from)")
            return drift
        lock_bytes = lock_path.read_bytes()
        have = hashlib.sha256(lock_bytes).hexdigest()
        if built_from and have != built_from:
            drift.differences.append(f"{lock_path}: sha256 {have}, {built_from} in the SBOM "
                                     "(the lock the image was built from)")
        platform = _property(sbom.get("metadata", {}), "magi2studio:platform") or "cpu"
        try:
            check_lock(yaml.safe_load(lock_bytes.decode("utf-8")), sbom, drift, platform)
        except (ValueError, yaml.YAMLError, LookupError, TypeError, AttributeError) as err:
            why = " ".join(str(err).split())  # a YAML error spans lines; doctor prints one a difference
            drift.differences.append(f"{lock_path}: cannot be read ({err.__class__.__name__}: {why}); "
                                     "its pins were not checked")
    return drift
