"""The charts of a serving-load gate: the series a reader looks for, the knee at its load, labels escaped."""

import re
import xml.etree.ElementTree as ET

import pytest

from harness.report.load_charts import throughput_vs_load_svg, ttft_cdf_svg, ttft_vs_load_svg

NS = {"svg": "http://www.w3.org/2000/svg"}
LOADS = [1.0, 2.0, 4.0, 8.0]
PCTS = {
    "p50": [(0.10, 0.09, 0.11), (0.12, 0.10, 0.13), (0.20, 0.18, 0.25), (0.90, 0.70, 1.20)],
    "p90": [(0.15, 0.14, 0.16), (0.20, 0.18, 0.22), (0.35, 0.30, 0.45), (1.80, 1.50, 2.40)],
    "p99": [(0.30, 0.25, 0.35), (0.40, 0.33, 0.45), (0.60, 0.50, 0.80), (3.10, 2.50, 4.00)],
}


def element(svg: str, gid: str) -> ET.Element:
    el = ET.fromstring(svg).find(f".//*[@id='{gid}']")
    assert el is not None, f"no element {gid}"
    return el


def vertices(svg: str, gid: str) -> list[tuple[float, float]]:
    """The (x, y) vertices of the first path of an element (a line's drawn path)."""
    d = element(svg, gid).find("svg:path", NS).get("d")
    nums = [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", d)]
    return list(zip(nums[0::2], nums[1::2]))


def test_ttft_vs_load_draws_each_percentile_with_its_band_the_slo_and_the_knee_at_its_load():
    svg = ttft_vs_load_svg(LOADS, PCTS, slo_s=1.0, slo_name="p95", knee=4.0)
    for name in ("p50", "p90", "p99"):
        assert len(vertices(svg, f"ttft-{name}")) == 4  # one vertex per load point
        element(svg, f"band-{name}")
    p90 = vertices(svg, "ttft-p90")
    knee = vertices(svg, "knee-line")
    assert knee[0][0] == knee[1][0] == pytest.approx(p90[2][0])  # x of the third load point: 4 req/s
    assert knee[0][0] != pytest.approx(p90[1][0]) and knee[0][0] != pytest.approx(p90[3][0])
    slo = vertices(svg, "slo-line")
    marker = element(svg, "knee-marker").find(".//svg:use", NS)
    assert float(marker.get("x")) == pytest.approx(p90[2][0]) and float(marker.get("y")) == pytest.approx(slo[0][1])
    # a higher TTFT is drawn higher (smaller SVG y): the lines follow the data, not their order
    assert [y for _, y in vertices(svg, "ttft-p99")] == sorted((y for _, y in vertices(svg, "ttft-p99")), reverse=True)
    assert 'id="knee-none"' not in svg


def test_the_knee_moves_with_its_load_and_a_missing_knee_is_said():
    at2 = ttft_vs_load_svg(LOADS, PCTS, slo_s=0.5, knee=2.0)
    assert vertices(at2, "knee-line")[0][0] == pytest.approx(vertices(at2, "ttft-p50")[1][0])
    none = ttft_vs_load_svg(LOADS, PCTS, slo_s=0.01, knee=None)
    assert 'id="knee-line"' not in none and 'id="knee-none"' in none


def test_a_point_without_a_figure_is_left_out_not_drawn_at_zero():
    bands = dict(PCTS, p99=[PCTS["p99"][0], None, (float("nan"),) * 3, PCTS["p99"][3]])
    svg = ttft_vs_load_svg(LOADS, bands, slo_s=1.0, knee=4.0)
    assert len(vertices(svg, "ttft-p99")) == 2 and len(vertices(svg, "ttft-p50")) == 4


def test_throughput_and_goodput_against_load_with_the_offered_rate():
    thr = [(1.0, 0.98, 1.0), (2.0, 1.9, 2.0), (3.9, 3.8, 4.0), (5.1, 4.7, 5.5)]
    good = [(1.0, 0.98, 1.0), (2.0, 1.9, 2.0), (3.5, 3.2, 3.9), (0.4, 0.1, 0.9)]
    svg = throughput_vs_load_svg(LOADS, thr, good, knee=4.0, offered=True)
    t, g = vertices(svg, "throughput-line"), vertices(svg, "goodput-line")
    assert len(t) == len(g) == 4 and g[3][1] > t[3][1]  # goodput drawn below throughput past the knee
    element(svg, "band-throughput"), element(svg, "band-goodput")
    offered = vertices(svg, "offered-line")
    assert offered[0] == pytest.approx(t[0], abs=0.01)  # 1 req/s offered, 1 req/s served
    assert vertices(svg, "knee-line")[0][0] == pytest.approx(t[2][0])
    closed = throughput_vs_load_svg(LOADS, thr, good, load_label="concurrency", load_unit="users")
    assert 'id="offered-line"' not in closed and 'id="knee-line"' not in closed


def test_ttft_cdf_one_curve_per_point_and_the_slo():
    svg = ttft_cdf_svg([("1 req/s", [0.1, 0.2, 0.3]), ("2 req/s", [0.2, 0.4]), ("4 req/s", [])], slo_s=0.25)
    assert len(vertices(svg, "cdf-1_req_s")) >= 3 and 'id="cdf-2_req_s"' in svg
    assert 'id="cdf-4_req_s"' not in svg  # a point with no successful request draws no curve
    slo = vertices(svg, "slo-line")
    xs = [x for x, _ in vertices(svg, "cdf-1_req_s")]
    assert min(xs) < slo[0][0] < max(xs)


def test_labels_from_a_bundle_are_escaped_in_the_svg():
    hostile = '<script>alert(1)</script> --> & "x"'
    svgs = [ttft_cdf_svg([(hostile, [0.1, 0.2])], title=hostile),
            ttft_vs_load_svg(LOADS, PCTS, title=hostile, load_label=hostile, load_unit=hostile, knee=2.0),
            throughput_vs_load_svg(LOADS, PCTS["p50"], PCTS["p50"], title=hostile, load_label=hostile)]
    for svg in svgs:
        assert "<script" not in svg and "&lt;script&gt;alert(1)" in svg  # there, as text
        assert svg.count("-->") == svg.count("<!--")  # no comment closed early by a label
        ET.fromstring(svg)  # still well-formed XML
