"""What both boundaries of ``elastic-dew simulate`` must agree on, for one program's two verdicts.

Shared by the differential test (``tests/test_proxy_differential.py``, every corpus program and
mistake) and the proxy boundary's own test of pathwaysutils' workload (``tests/test_proxy.py``),
so that both compare the same properties.
"""

from __future__ import annotations

from elastic_dew.proxy.records import UNSEEN


def fired(verdict: dict) -> list:
    return [(f["scheduled"],) if "@+" in f["scheduled"] else (f["scheduled"], f["step"]) for f in verdict["fired"]]


def costs(verdict: dict, steps: bool = True) -> list:
    """What each fault cost, as both boundaries can tell it: not the seconds, not how it was
    detected (in-process a dispatch onto a lost slice fails, through the proxy its read does),
    not the step number a program gave a save (the proxy sees the state's position only)."""
    out = []
    for c in verdict["costs"]:
        step = () if "@+" in c["fault"] else (c["step"],)
        resumed_step = c["resumed_step"] if c["resumed_from"] in ("live", "nothing") else None
        out.append((c["fault"], *step, c["process"], c["resumed_from"], resumed_step, c["redone_steps"], c["part_of"],
                    c["taken_up_after_steps"], c["steps_short"]))
    totals = verdict["totals"] or {}
    return [*out, ("totals", totals.get("steps") if steps else None, totals.get("redone_steps"),
                   totals.get("steps_short"))]


def problems(verdict: dict) -> list:
    """The problems both boundaries evaluate, by kind and process (an attempt the proxy
    boundary does not see start shifts the attempt number). A ``Snapshotter`` made again in
    each attempt is named by its cause in-process (``recreated_per_attempt``, instead of
    ``restored_nothing``); through the proxy, which cannot see the program's objects, by what
    it did: a fresh state while the first ``Snapshotter``'s snapshot was still held."""
    named = {("restored_nothing" if p["kind"] == "recreated_per_attempt" and "Snapshotter" in p["detail"]
              else p["kind"], p["process"]) for p in verdict["problems"]}
    return sorted((kind, process) for kind, process in named if kind not in UNSEEN)


def assert_boundaries_agree(proxy: dict, inside: dict, *, correct: bool, attempts: bool = True,
                            steps: bool = True) -> None:
    """Both verdicts fire the same faults at the same steps (a fault keyed to time: the same
    faults), end each process the same way, start the same attempts (unless ``attempts`` is
    false: attempts the backend cannot see), cost the same (the totals' steps only if
    ``steps``) and find the same problems among the rules both see; a ``correct`` program gets
    every fault fired and met, and exit 0. Only the proxy boundary has rules it cannot see."""
    assert fired(proxy) == fired(inside), (proxy["fired"], inside["fired"])
    assert proxy["never_fired"] == inside["never_fired"]
    assert [p["status"] for p in proxy["processes"]] == [p["status"] for p in inside["processes"]]
    if correct:
        assert proxy["never_fired"] == [] and proxy["unmet"] == [] and proxy["ok"]
    if attempts:
        assert [p["attempts"] for p in proxy["processes"]] == [p["attempts"] for p in inside["processes"]]
    assert costs(proxy, steps) == costs(inside, steps), (proxy["costs"], inside["costs"])
    assert problems(proxy) == problems(inside), (proxy["problems"], inside["problems"])
    assert {u["kind"] for u in proxy["unseen"]} == set(UNSEEN) and inside["unseen"] == []
