"""The fio parser on captured real fio 3.33 JSON (io_uring and libaio, several jobs and groups)."""

import pytest

from harness.errors import WorkloadError
from harness.parsers.fio import StreamSpec, job_file, parse_cpulist, parse_fio_json, split_regions


def read(fixtures, name):
    return (fixtures / "fio" / name).read_text()


def test_grouped_io_uring(fixtures):
    run = parse_fio_json(read(fixtures, "io_uring_2groups_2jobs_grouped.json"))
    assert run.version == "fio-3.33"
    assert [g.label for g in run.groups] == ["gpu0", "gpu1"]
    g0 = run.group("gpu0")
    assert g0.read_bw_bytes_s == 906251295
    assert g0.read_gb_s == pytest.approx(0.906251295)
    assert g0.read_bytes == 1889533952
    assert g0.lat_p50_us is not None and g0.lat_p50_us > 0


def test_ungrouped_libaio_jobs_are_summed_per_group(fixtures):
    run = parse_fio_json(read(fixtures, "libaio_2groups_2jobs_ungrouped.json"))
    assert [(g.label, g.jobs) for g in run.groups] == [("gpu0", 2), ("gpu1", 2)]
    assert run.group("gpu0").read_bw_bytes_s == 142418531 + 147561913
    assert run.group("gpu1").read_bw_bytes_s == 402698909 + 402378693


def test_randread_iops(fixtures):
    run = parse_fio_json(read(fixtures, "io_uring_randread_4k_1group.json"))
    (g,) = run.groups
    assert g.read_iops > 1000
    assert g.read_bw_bytes_s == pytest.approx(g.read_iops * 4096, rel=0.01)


def test_leading_warnings_are_skipped(fixtures):
    text = "fio: some warning\n" + read(fixtures, "io_uring_randread_4k_1group.json")
    assert parse_fio_json(text).groups[0].label == "stream0"


def test_no_json_is_an_error():
    with pytest.raises(WorkloadError, match="no JSON"):
        parse_fio_json("fio: failed to open file\n")


def test_job_file_regions_are_disjoint_and_pinned():
    regions = split_regions(10 * 2**20, 3, 2**20)
    assert regions == [(0, 3 * 2**20), (3 * 2**20, 3 * 2**20), (6 * 2**20, 3 * 2**20)]
    text = job_file("/dev/nvme0n1", [StreamSpec("gpu0", 0, 2**20, "0-3", 0), StreamSpec("gpu1", 2**20, 2**20, None, 1)],
                    ioengine="libcufile")
    assert "cpus_allowed=0-3" in text and "gpu_dev_ids=1" in text and "cuda_io=cufile" in text
    assert text.count("new_group") == 1


def test_job_file_refuses_fio_separators():
    with pytest.raises(WorkloadError):
        job_file("/tmp/a:b", [StreamSpec("s", 0, 4096)])


def test_cpulist():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
