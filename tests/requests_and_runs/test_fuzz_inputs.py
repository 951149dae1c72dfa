"""Property-based fuzz of requests, request YAML, sample sets, the CLI's flags and manifests (issue 19).

Every drawn input ends accepted or in one ``<field>: <problem>. Fix: <fix>`` line: never a
traceback, never a file outside outputs. Nothing here runs a generation: the CLI cases stop
at the validation door (an unknown engine), the manifest cases use ``verify`` on one tiny
2-step run. Bounded by max_examples so the module takes about a minute on 2 cores;
``MAGI2STUDIO_FUZZ_EXAMPLES`` scales it.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from magi2studio.run_folder import runs
from magi2studio.cli import main

from . import fuzzing as F

EXAMPLES = int(os.environ.get("MAGI2STUDIO_FUZZ_EXAMPLES", "150"))
BOUNDED = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def clean(outcome: str) -> None:
    assert outcome in ("accepted", "refused"), outcome


@BOUNDED
@given(F.request_fields)
def test_requests(fields):
    clean(F.attempt_request(fields))


@BOUNDED
@given(st.one_of(st.text(max_size=80), st.dictionaries(st.sampled_from(sorted(F.field_values)), F.junk,
                                                         max_size=4).map(str)))
def test_request_yaml(tmp_path, text):
    clean(F.attempt_request_yaml(text, tmp_path))


@pytest.fixture(scope="module")
def set_folder(tmp_path_factory):
    return F.make_set_folder(tmp_path_factory.mktemp("fuzz-set"))


@BOUNDED
@given(F.sample_sets)
def test_sample_sets(set_folder, data):
    clean(F.attempt_sample_set(data, set_folder))


@BOUNDED
@given(F.cli_argv)
def test_cli_flags(tmp_path, argv):
    clean(F.attempt_cli(argv, tmp_path / "out"))


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz-runs")
    assert main(["generate", "--prompt", "a red kite over a windy beach", "--steps", "2", "--out", str(out)]) == 0
    (folder,) = [p for p in out.iterdir() if runs.is_complete(p)]
    # Any edit of a current folder's manifest is refused by its run id before a field is read; an older
    # folder's manifest is checked field by field, which is what the fuzz is for.
    return F.made_before_run_ids(folder, tmp_path_factory.mktemp("fuzz-older"))


@settings(BOUNDED, max_examples=max(EXAMPLES // 3, 10))
@given(F.manifest_edits)
def test_manifests(run_folder, edit):
    clean(F.attempt_manifest(run_folder, (run_folder / "manifest.json").read_bytes(), edit))
