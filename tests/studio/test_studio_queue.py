"""The shared engine slot seen from many clients: FIFO order, queue positions, cancel."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from magi2studio.run_folder import runs
from studio_support import everything_under, generate_args, wait_for_output

CLIENTS = 16


@pytest.mark.slow
def test_sixteen_concurrent_clients_finish_in_submission_order(studio):
    finished: list[int] = []
    lock = threading.Lock()

    def on_done(index: int):
        def record(*_):
            with lock:
                finished.append(index)
        return record

    jobs = []
    for index in range(CLIENTS):
        client = Client(studio.url, verbose=False)
        # deterministic off: the order is the point, not the bits (its exact products made the 2 steps 4 of each
        # run's 7.6 s; 122 s for the test before, quiet)
        job = client.submit(**generate_args(seed=1000 + index, steps=2, deterministic=False), api_name="/generate",
                            result_callbacks=[on_done(index)])
        wait_for_output(job, "queued (ticket")  # the server has it: submission order is now fixed
        jobs.append(job)
    results = [job.result(timeout=900) for job in jobs]

    assert finished == list(range(CLIENTS))
    tickets = [result[2]["studio"]["ticket"] for result in results]
    assert tickets == sorted(tickets) and len(set(tickets)) == CLIENTS
    assert [result[2]["request"]["seed"] for result in results] == [1000 + i for i in range(CLIENTS)]
    folders = {Path(result[3]).stem for result in results}  # the zip is named after its run folder
    assert len(folders) == CLIENTS
    assert all(runs.is_complete(studio.outputs / name) for name in folders)
    # Clients behind the first one were told where they stood while they waited.
    assert any("waiting: position" in str(output) for job in jobs[2:] for output in job.outputs())


@pytest.mark.slow
def test_cancel_stops_the_run_at_a_step_boundary_and_keeps_no_folder(studio):
    before = everything_under(studio.outputs)
    client = Client(studio.url, verbose=False)
    job = client.submit(**generate_args(seed=3, steps=60), api_name="/generate")
    wait_for_output(job, "preview: step 2/60", timeout_s=120)
    assert "cancelling" in str(client.predict(api_name="/cancel"))
    with pytest.raises(AppError, match="cancelled at a step boundary"):
        job.result(timeout=120)
    assert everything_under(studio.outputs) == before
    assert studio.ctx.slot.waiting() == 0
