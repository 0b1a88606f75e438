import pytest

from harness.units import UnitError, parse_quantity, parse_threshold


@pytest.mark.parametrize("text,unit,value", [
    ("5.23 GB/s", "MB/s", 5230.0),
    ("1 GiB/s", "GB/s", 1.073741824),
    ("100 Gbit/s", "GB/s", 12.5),
    ("4 KiB", "B", 4096.0),
    ("11.85 s", "ms", 11850.0),
    ("250 ms", "s", 0.25),
    ("90 %", "x", 0.9),
])
def test_conversions(text, unit, value):
    assert parse_quantity(text).to(unit) == pytest.approx(value)


def test_threshold_compares_across_units():
    thr = parse_threshold(">= 5.0 GB/s")
    assert thr.holds(parse_quantity("5000 MB/s").base)
    assert not thr.holds(parse_quantity("4.9 GB/s").base)
    # 5 GiB/s is more than 5 GB/s
    assert thr.holds(parse_quantity("4.7 GiB/s").base)
    assert parse_threshold("< 3 GB/s").holds(parse_quantity("2999 MB/s").base)
    assert not parse_threshold("< 3 GB/s").holds(parse_quantity("3 GB/s").base)


def test_dimension_is_checked():
    with pytest.raises(UnitError, match="is a time, expected a bandwidth"):
        parse_quantity("5 s", "bandwidth")
    with pytest.raises(UnitError, match="cannot convert"):
        parse_quantity("5 GB/s").to("s")


@pytest.mark.parametrize("bad", ["5 GB/sec", "GB/s", "five GB/s", "", "5 G B/s"])
def test_bad_quantities(bad):
    with pytest.raises(UnitError):
        parse_quantity(bad)


@pytest.mark.parametrize("bad", ["5 GB/s", "=> 5 GB/s", "== 5 GB/s", ">="])
def test_bad_thresholds(bad):
    with pytest.raises(UnitError):
        parse_threshold(bad)
