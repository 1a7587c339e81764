"""Status shape helpers: conditions keep their transition time, patches are minimal, progress is throttled."""

from __future__ import annotations

from praesto.agent import status as st

from praesto import names


def test_condition_transition_time_moves_only_on_status_change() -> None:
    first = st.condition(st.READY, False, "Downloading", "d", 1000.0, None)
    same = st.condition(st.READY, False, "Failed", "f", 2000.0, [first])
    flipped = st.condition(st.READY, True, "Cached", "c", 3000.0, [same])
    assert same["lastTransitionTime"] == first["lastTransitionTime"] == st.rfc3339(1000.0)
    assert flipped["lastTransitionTime"] == st.rfc3339(3000.0)


def test_desired_patch_is_minimal_and_removes_fields() -> None:
    current, _ = st.desired(
        {}, names.PHASE_DOWNLOADING, "Downloading", "m", 0.0, {"progress": {"bytesDone": 1}}
    )
    patch, changed = st.desired(current, names.PHASE_DOWNLOADING, "Downloading", "m", 5.0, {"progress": None})
    assert patch == {"progress": None} and not changed
    again, changed = st.desired(
        current, names.PHASE_DOWNLOADING, "Downloading", "m", 5.0, {"progress": {"bytesDone": 1}}
    )
    assert again == {} and not changed
    ready, changed = st.desired(current, names.PHASE_READY, "Cached", "ok", 9.0, {})
    assert changed and ready["phase"] == names.PHASE_READY
    assert [c["status"] for c in ready["conditions"]] == ["True"]


def test_throttle() -> None:
    now = [0.0]
    throttle = st.Throttle(3.0, clock=lambda: now[0])
    assert throttle.allow("a") and not throttle.allow("a") and throttle.allow("b")
    now[0] = 2.9
    assert not throttle.allow("a")
    now[0] = 3.0
    assert throttle.allow("a")


def test_rate_and_eta_only_while_downloading() -> None:
    """A copy that leaves Downloading (Ready, Failed, Pending) keeps its counts, not its rate and time left."""
    counts = {"bytesDone": 40, "bytesTotal": 100}
    running = {**counts, "bytesPerSecond": 10, "etaSeconds": 6}
    current, _ = st.desired({}, names.PHASE_DOWNLOADING, "Downloading", "m", 0.0, {"progress": running})
    assert current["progress"] == running
    for phase, reason in ((names.PHASE_FAILED, "SourceUnavailable"), (names.PHASE_PENDING, "Pending")):
        patch, _ = st.desired(current, phase, reason, "m", 5.0, {})
        assert patch["progress"] == {"bytesPerSecond": None, "etaSeconds": None}
    ready, _ = st.desired(
        current, names.PHASE_READY, "Cached", "ok", 9.0, {"progress": {**counts, "bytesDone": 100}}
    )
    assert ready["progress"] == {"bytesDone": 100, "bytesPerSecond": None, "etaSeconds": None}


def test_patch_removes_keys_inside_an_object() -> None:
    """A merge patch merges objects: a key the new value lacks must be sent as null, or it stays."""
    current = {"progress": {"bytesDone": 1, "bytesTotal": 2, "etaSeconds": 3}, "phase": "Downloading"}
    assert st.status_patch(
        current, {"progress": {"bytesDone": 2, "bytesTotal": 2}, "phase": "Downloading"}
    ) == {"progress": {"bytesDone": 2, "etaSeconds": None}}
    assert st.status_patch(current, {"progress": None, "phase": "Downloading"}) == {"progress": None}
    assert st.status_patch(current, dict(current)) == {}
