"""The MUSA report's per-step metric on multi-rank data, and manifest hashing."""

import numpy as np
import pytest

from magi2studio import media
from magi2studio.engines.timing import StepRecord, gate_summary, slowest_rank_per_step


def test_gate_takes_slowest_rank_and_drops_steps_0_and_1():
    records = []
    for step, per_rank in enumerate([[900, 100], [50, 800], [10, 12], [20, 11], [15, 30]]):
        records += [StepRecord(rank, "preview", step, ms).as_dict() for rank, ms in enumerate(per_rank)]
    records.append(StepRecord(0, "refiner", 0, 5000).as_dict())
    assert slowest_rank_per_step(records) == {0: 900, 1: 800, 2: 12, 3: 20, 4: 30}
    summary = gate_summary(records)
    assert summary["gate_ms"] == pytest.approx((12 + 20 + 30) / 3)
    assert (summary["median_ms"], summary["min_ms"], summary["max_ms"]) == (20, 12, 30)
    assert summary["ranks"] == [0, 1] and summary["excluded_steps"] == [0, 1]
    assert gate_summary(records, "refiner")["gate_ms"] is None


def test_hashes_are_of_the_arrays():
    frames = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
    audio = np.linspace(-1, 1, 20, dtype=np.float32).reshape(10, 2)
    import hashlib
    assert media.frames_sha256(frames) == hashlib.sha256(frames.tobytes()).hexdigest()
    assert media.pcm_sha256(audio.astype(np.float64)) == hashlib.sha256(audio.tobytes()).hexdigest()
    changed = frames.copy()
    changed[1, 2, 3, 0] ^= 1
    assert media.frames_sha256(changed) != media.frames_sha256(frames)
