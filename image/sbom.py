"""Writes the image's bill of materials, /etc/magi2studio/sbom.cdx.json (CycloneDX 1.5 JSON), at build time.

Run by image/Dockerfile after image/install.sh. Every Python distribution in the venv with its
version and the sha256 of the wheel it was installed from (pip's own ``--report`` files, which
install.sh writes: a distribution carries no record of its wheel once installed), every Debian
package with its version (dpkg), the base image and its digest, and for cuda/musa the vLLM-Omni
commit. Why not a maintained generator: cyclonedx-py reads an environment's names and versions
but cannot know the wheel hashes and reads no dpkg database; syft reads both databases but no
wheel hashes either, and is a Go program the image does not carry. The output is a function of
the installed packages, the reports and the build args only (no clock, no paths, sorted), so
two builds of the same recipe write the same bytes.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

SBOM_PATH = "/etc/magi2studio/sbom.cdx.json"
ENSUREPIP_WHEELS = Path("/usr/share/python-wheels")  # Debian's wheels that `python3 -m venv` installs


def canonical(name: str) -> str:
    """PEP 503's normalized name: what pip's report and the installed metadata agree on."""
    return "-".join(name.replace("_", "-").replace(".", "-").lower().split("-"))


def wheel_hashes(report_dir: Path) -> dict[str, dict[str, str]]:
    """name -> {version, sha256} of each wheel pip installed, from every ``pip install --report`` file."""
    found: dict[str, dict[str, str]] = {}
    for report in sorted(report_dir.glob("*.json")):
        for item in json.loads(report.read_text(encoding="utf-8")).get("install", []):
            meta = item["metadata"]
            archive = item.get("download_info", {}).get("archive_info", {})
            sha256 = (archive.get("hashes") or {}).get("sha256") or archive.get("hash", "").removeprefix("sha256=")
            found[canonical(meta["name"])] = {"version": meta["version"], "sha256": sha256 or ""}
    return found


def python_components(report_dir: Path, path: list[str] | None = None) -> list[dict]:
    """Every distribution this interpreter sees (or those on ``path``): the venv's and (cuda/musa) the base's."""
    wheels = wheel_hashes(report_dir)
    dropped = report_dir / "dropped-files.txt"
    removed = dropped.read_text(encoding="utf-8").split() if dropped.is_file() else []
    components: dict[str, dict] = {}
    # Only the site folders: setuptools, once imported, puts its _vendor folder on sys.path too.
    sites = [entry for entry in sys.path if Path(entry).name in ("site-packages", "dist-packages")]
    for dist in metadata.distributions(path=sites if path is None else path):
        name, version = dist.metadata["Name"], dist.version
        key = canonical(name)
        if key in components:
            continue  # the first on sys.path wins, as it does for an import
        component = {"type": "library", "name": name, "version": version,
                     "purl": f"pkg:pypi/{key}@{version}", "bom-ref": f"pkg:pypi/{key}@{version}"}
        wheel = wheels.get(key)
        ensurepip = sorted(ENSUREPIP_WHEELS.glob(f"{key.replace('-', '_')}-{version}-*.whl"))
        if wheel and wheel["version"] == version and wheel["sha256"]:
            component["hashes"] = [{"alg": "SHA-256", "content": wheel["sha256"]}]
            origin = "wheel"
        elif ensurepip and path is None:  # `python3 -m venv` installed it from the base's own wheel
            sha256 = hashlib.sha256(ensurepip[0].read_bytes()).hexdigest()
            component["hashes"] = [{"alg": "SHA-256", "content": sha256}]
            origin = f"the base's {ensurepip[0].name}"
        else:
            origin = "local source tree" if key == "magi2studio" else "base image"
        component["properties"] = [{"name": "magi2studio:origin", "value": origin}]
        # RECORD vouches for the installed files but sits beside them: its own sha256 lets the drift
        # check (magi2studio/drift.py) tell a reinstall of another build of this version, or an edit of both.
        record = dist.read_text("RECORD")
        if record is not None:
            component["properties"].append({"name": "magi2studio:record_sha256",
                                            "value": hashlib.sha256(record.encode("utf-8")).hexdigest()})
        # Files install.sh removed on purpose (vLLM's CUDA kernels on cpu): RECORD lists them.
        gone = sorted(path for path in removed if any(str(f) == path for f in dist.files or ()))
        if gone:
            component["properties"].append({"name": "magi2studio:removed_files", "value": " ".join(gone)})
        components[key] = component
    return [components[key] for key in sorted(components)]


def debian_components() -> list[dict]:
    out = subprocess.run(["dpkg-query", "-W", "-f", "${db:Status-Abbrev}\t${Package}\t${Version}\t${Architecture}\n"],
                         check=True, capture_output=True, text=True).stdout
    components = []
    for line in sorted(out.splitlines()):
        status, name, version, arch = line.split("\t")
        if not status.startswith("ii"):
            continue
        purl = f"pkg:deb/debian/{name}@{version}?arch={arch}"
        components.append({"type": "library", "name": name, "version": version, "purl": purl, "bom-ref": purl})
    return components


def sbom(args: argparse.Namespace) -> dict:
    base = {"type": "container", "name": args.base, "version": args.base_digest or "",
            "bom-ref": f"base:{args.base}"}
    properties = [{"name": "magi2studio:platform", "value": args.platform},
                  {"name": "magi2studio:git_revision", "value": args.revision},
                  {"name": "magi2studio:lock_sha256", "value": args.lock_sha256},
                  {"name": "magi2studio:base_image_digest", "value": args.base_digest}]
    if args.vllm_omni_commit:
        properties.append({"name": "magi2studio:vllm_omni_commit", "value": args.vllm_omni_commit})
    # The files in the site folders no RECORD lists (musa's torchada .pth, say): drift names any other.
    from magi2studio.drift import site_dirs, unrecorded_files

    properties.append({"name": "magi2studio:unrecorded_files", "value": "\n".join(unrecorded_files(site_dirs()))})
    document = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "tools": {"components": [{"type": "application", "name": "magi2studio image/sbom.py"}]},
            "component": {"type": "container", "name": f"magi2studio:{args.platform}", "version": args.revision,
                          "bom-ref": "image"},
            "properties": properties,
        },
        "components": [base, *python_components(Path(args.pip_reports)), *debian_components()],
    }
    if args.source_date_epoch:
        # The commit's time, never the clock: the same recipe writes the same bytes.
        when = datetime.datetime.fromtimestamp(int(args.source_date_epoch), datetime.timezone.utc)
        document["metadata"]["timestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    return document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=SBOM_PATH)
    parser.add_argument("--pip-reports", required=True, help="folder of install.sh's pip --report files")
    parser.add_argument("--platform", required=True, choices=("cpu", "cuda", "musa"))
    parser.add_argument("--base", required=True)
    for name in ("base-digest", "vllm-omni-commit", "revision", "lock-sha256", "source-date-epoch"):
        parser.add_argument(f"--{name}", default="")
    args = parser.parse_args(argv)
    if not any(Path(args.pip_reports).glob("*.json")):
        sys.exit(f"sbom: no pip report in {args.pip_reports}: run image/install.sh with MAGI2_PIP_REPORTS set")
    document = sbom(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".sbom-")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=1, sort_keys=True)
        handle.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)
    kinds = [c["purl"].split("/")[0] for c in document["components"] if "purl" in c]
    print(f"sbom: wrote {out} ({kinds.count('pkg:pypi')} Python distributions, "
          f"{kinds.count('pkg:deb')} Debian packages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
