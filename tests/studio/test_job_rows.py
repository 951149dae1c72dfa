"""The job list's row buttons (fast: a panel over a fixed queue state, no engine): each button is named for its
job, and a done job whose run folder was deleted offers no "open"."""

from __future__ import annotations

import re
from types import SimpleNamespace

from magi2studio.jobs.jobqueue import JobRecord, QueueState
from magi2studio.studio.job_panel import JobPanel


def panel_over(tmp_path, *jobs: JobRecord) -> JobPanel:
    slot = SimpleNamespace(snapshot=lambda: QueueState(jobs=list(jobs)), running_clock=lambda: None)
    panel = JobPanel(SimpleNamespace(slot=slot, outputs_root=tmp_path))
    panel.owns = lambda record, request: True  # the caller's own jobs: they carry buttons
    return panel


def done_job(ticket: int, seed: int, run: str) -> JobRecord:
    return JobRecord(id=f"{ticket:032x}", ticket=ticket, state="done", layout="sp1-cfg1", owner="me",
                     source="studio", submitted=1.0, started=2.0, finished=3.0, run=run,
                     request={"mode": "t2va", "tier": "272p", "seed": seed, "prompt": "a kite"})


def test_row_buttons_are_named_for_their_job_and_a_deleted_run_offers_no_open(tmp_path):
    kept, deleted = "20261206-101500-t2va-272p-s1-aaaaaa", "20261206-101600-t2va-272p-s2-bbbbbb"
    (tmp_path / kept).mkdir()
    html = panel_over(tmp_path, done_job(1, 1, kept), done_job(2, 2, deleted)).render()
    labels = re.findall(r'<button data-action="(\w[\w ]*)" data-job="[0-9a-f]+" aria-label="([^"]+)"', html)
    assert ("open", "open job #1: T2VA 272p seed 1 sp1-cfg1: a kite") in labels
    assert ("remove", "remove job #2: T2VA 272p seed 2 sp1-cfg1: a kite") in labels
    assert not any(action == "open" and "#2" in label for action, label in labels), labels
