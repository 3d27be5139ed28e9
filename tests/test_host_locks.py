"""The judge's host-wide file locks (filelock): estimator slots and one reference record
computed by one worker of the host at a time."""

from __future__ import annotations

import time

import pytest

from tilewright.kernels.worker.tpu.compile_pool import Slots
from tilewright.kernels.worker.tpu.reference import _host_lock


def test_an_estimator_slot_is_held_by_one_holder_at_a_time(tmp_path) -> None:
    with Slots(tmp_path, 1).hold(time.monotonic() + 5):
        with pytest.raises(TimeoutError, match="stayed busy"), \
                Slots(tmp_path, 1).hold(time.monotonic() + 0.3):
            pass
        with Slots(tmp_path, 2).hold(time.monotonic() + 0.3):  # the second slot is free
            pass
    with Slots(tmp_path, 1).hold(time.monotonic() + 1):  # released
        pass
    with Slots(None, 1).hold(time.monotonic()):  # no folder: no coordination
        pass


def test_a_reference_record_lock_waits_then_goes_ahead(tmp_path) -> None:
    order = []
    with _host_lock(tmp_path, "k" * 40, time.monotonic() + 5):
        started = time.monotonic()
        with _host_lock(tmp_path, "k" * 40, time.monotonic() + 0.3):
            order.append("went ahead")  # a stuck holder does not stop the next one
        assert time.monotonic() - started >= 0.25
        with _host_lock(tmp_path, "other", time.monotonic() + 0.3):
            order.append("another record")
    with _host_lock(tmp_path, "k" * 40, time.monotonic()):
        order.append("free again")
    assert order == ["went ahead", "another record", "free again"]
    assert (tmp_path / "references").is_dir()
