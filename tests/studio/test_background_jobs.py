"""The long tabs' background jobs: events in order, exactly one terminal event, stop and clean-up."""

import threading

from magi2studio.errors import Cancelled
from magi2studio.studio.background import BackgroundJobs


def test_a_job_reports_its_events_then_its_result_and_cleans_up():
    jobs, cleaned = BackgroundJobs("t", (Cancelled,)), threading.Event()

    def job(cancel, emit):
        emit("start", "a", None)
        emit("done", "a", 1)
        return "report"

    events = list(jobs.start("me", job, cleanup=cleaned.set))
    assert events == [("start", "a", None), ("done", "a", 1), ("finished", "report", None)]
    assert cleaned.is_set() and not jobs.stop("me")


def test_stop_sets_the_cancel_event_and_the_stop_error_ends_the_job_as_stopped():
    jobs, started = BackgroundJobs("t", (Cancelled,)), threading.Event()

    def job(cancel, emit):
        started.set()
        cancel.wait(10)
        raise Cancelled("stopped by the user")

    events = jobs.start("me", job)
    assert started.wait(10) and not jobs.stop("someone else") and jobs.stop("me")
    assert list(events) == [("stopped", "stopped by the user", None)]


def test_failures_end_as_one_readable_error_line():
    jobs = BackgroundJobs("t", (Cancelled,))

    def disk_full(cancel, emit):
        raise OSError(28, "No space left on device")

    def broken(cancel, emit):
        raise ValueError("bad")

    (kind, message, _), = list(jobs.start("me", disk_full))
    assert kind == "error" and "No space left on device" in message
    assert list(jobs.start("me", broken)) == [("error", "ValueError: bad", None)]
