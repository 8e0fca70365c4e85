"""Every load signal the server reports (a ``RankLoad`` field) reaches the lane's telemetry line,
or says why it does not: a new signal is one field there (``server/loads.py``), and this test
fails for one that the telemetry silently drops."""

from __future__ import annotations

import typing
from dataclasses import fields

import pytest

from eagledata.capacity.controller import Lane, LaneSample
from eagledata.capacity.controller_settings import ControllerSettings
from eagledata.run.telemetry import lane_entry
from eagledata.rundir.lines import TelemetryLine
from eagledata.server.loads import (
    RankLoad,
    ServerLoad,
    kept_out_because,
    merge_workers,
    signal,
    telemetry_key,
)


def every_signal_set() -> RankLoad:
    """A rank with every field set, each to a value no other field has."""
    hints = typing.get_type_hints(RankLoad)
    values: dict[str, object] = {}
    for index, load_field in enumerate(fields(RankLoad)):
        kind = hints[load_field.name]
        if kind in (int, int | None):
            values[load_field.name] = 1000 + index
        elif kind in (float, float | None):
            values[load_field.name] = index + 0.25  # exact at telemetry's four decimals
        else:
            pytest.fail(f"RankLoad.{load_field.name}: a {kind} signal this test cannot set")
    return RankLoad(**values)  # type: ignore[arg-type]


def telemetry_of(load: RankLoad) -> TelemetryLine:
    lane = Lane(server="http://s", rank=None, settings=ControllerSettings(), pool_tokens=10_000)
    lane.observe(LaneSample(time=1.0, load=load), 1.0)
    return lane_entry(lane, source="loads", in_flight=0, fixed=None)


def test_every_load_signal_reaches_a_telemetry_line_or_says_why_not() -> None:
    keys: dict[str, str] = {}
    for load_field in fields(RankLoad):
        key = telemetry_key(load_field)
        if key is None:
            assert kept_out_because(load_field), f"RankLoad.{load_field.name}: say why not"
            continue
        assert key in TelemetryLine.model_fields, (
            f"RankLoad.{load_field.name} goes to telemetry key {key!r}: add it to TelemetryLine "
            "(with its description), or keep it out with signal(None, why=...)"
        )
        assert key not in keys.values(), f"two signals write the telemetry key {key!r}"
        keys[load_field.name] = key
    load = every_signal_set()
    line = telemetry_of(load)
    for name, key in keys.items():
        assert getattr(line, key) == getattr(load, name), name


def test_a_router_lane_keeps_every_signal_of_its_workers() -> None:
    merged = merge_workers([ServerLoad("loads", (every_signal_set(),))])
    assert merged is not None
    dropped = [f.name for f in fields(RankLoad) if getattr(merged.ranks[0], f.name) is None]
    assert not dropped, f"merge_workers drops {dropped}: give it the signal's merge"


def test_a_line_before_any_sample_has_no_signals() -> None:
    lane = Lane(server="http://s", rank=None, settings=ControllerSettings())
    line = lane_entry(lane, source="none", in_flight=0, fixed=4)
    for load_field in fields(RankLoad):
        key = telemetry_key(load_field)
        if key is not None:
            assert getattr(line, key) is None, key


def test_the_usage_falls_back_to_used_over_the_lane_pool() -> None:
    line = telemetry_of(RankLoad(0, used_tokens=2500, running=3))
    assert line.token_usage == 0.25 and line.num_running_reqs == 3


def test_a_signal_kept_out_of_telemetry_must_say_why() -> None:
    with pytest.raises(ValueError, match="says why"):
        signal(None)
