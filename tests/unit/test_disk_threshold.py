from __future__ import annotations

from asyncbk.bookie.state import disk_read_only


def test_hysteresis() -> None:
    path = [0.5, 0.91, 0.95, 0.97, 0.93, 0.90, 0.89, 0.92]
    state = False
    seen = []
    for used in path:
        state = disk_read_only(state, used, 0.95, 0.90)
        seen.append(state)
    #              0.5    0.91   0.95  0.97  0.93  0.90  0.89   0.92
    assert seen == [False, False, True, True, True, True, False, False]
