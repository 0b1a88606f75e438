import pytest

from harness.units import UnitError, format_quantity, parse_quantity, parse_threshold


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


@pytest.mark.parametrize("value,unit,text", [
    # the loopback report showed nvme-integrity's checked_bytes as 2.09715e+06
    (2097152.0, "B", "2.0 MiB (2097152 bytes)"),
    (0.0, "B", "0 bytes"),
    (512, "B", "512 bytes"),
    (1, "B", "1 byte"),
    (1.5, "GiB", "1.5 GiB (1610612736 bytes)"),
    (1e9, "B", "953.7 MiB (1000000000 bytes)"),
    # times in ms below a second, s above; a long one with its minutes
    (0.94, "s", "940 ms"),
    (11.85, "s", "11.85 s"),
    (250, "ms", "250 ms"),
    (2e-5, "s", "20 µs"),
    (3600, "s", "3600 s (60.0 min)"),
    (0.0, "s", "0 s"),
    # rates in the unit declared; ratios with their percentage; factors; counts as integers
    (5.2345678, "GB/s", "5.235 GB/s"),
    (0.953, "ratio", "0.953 (95.3 %)"),
    (12.6, "x", "12.6 x"),
    (8.0, "count", "8"),
    (3.0, "", "3"),
    # not recorded, unknown or not finite: shown, never raised
    (2097152.0, None, "2.09715e+06"),
    (1.5, "furlongs", "1.5 furlongs"),
    (float("nan"), "B", "nan"),
    (None, "B", "—"),
    ("n/a", "B", "n/a"),
])
def test_format_quantity(value, unit, text):
    assert format_quantity(value, unit) == text
