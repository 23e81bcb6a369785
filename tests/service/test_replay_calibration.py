"""The job hands dispatch-replay-v1 its own recent validated pairs as calibration."""

from __future__ import annotations

from vecsched.core import replay as RP

RP.enable()


def test_the_job_hands_the_replay_its_own_recent_pairs() -> None:
    from vecsched.core.pairing import MemoryPairs, Pair
    from vecsched.service.replay_calibration import ReplayCalibration

    class Failing:
        def pairs(self, since: float, until: float) -> list:
            raise ConnectionError("down")

    store = MemoryPairs()
    store.add_pairs([Pair(RP.NAME, "text", "start", f"r{k}", 100.0 + k, 10.0, 70.0, 10.0 + k, False) for k in range(5)]
                    + [Pair("eligible-share-v1", "text", "start", "x", 100.0, 10.0, 70.0, 99.0, False),
                       Pair(RP.NAME, "text", "start", "old", 0.0, 10.0, 70.0, 99.0, False)])
    cal = ReplayCalibration(store, window=60.0, refresh=600.0)
    got = cal.get(now=150.0)[RP.NAME]["pairs"]["observed"].tolist()
    assert got == [10.0, 11.0, 12.0, 13.0, 14.0]  # its own, inside the window only
    store.add_pairs([Pair(RP.NAME, "text", "start", "new", 151.0, 10.0, 70.0, 50.0, False)])
    assert len(cal.get(now=160.0)[RP.NAME]["pairs"]["observed"]) == 5  # cached until the refresh
    assert len(cal.get(now=800.0)[RP.NAME]["pairs"]["observed"]) == 0  # window moved on
    broken = ReplayCalibration(Failing(), window=60.0)
    assert broken.get(now=1.0) == {}  # a failed read never raises into the cycle
