"""nvme smart-log: the pure parser on output captured from the qemu guest's nvmet loopback (Debian 6.1, nvme-cli
2.3), and the reconciliation of data units with the block counters (harness/parsers/smart.py)."""

from pathlib import Path

import pytest

from harness.parsers.smart import DATA_UNIT_BYTES, parse_smart_log, smart_device, smart_writes

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nvme" / "smart-log"
NINE_MIB = 9 * 1024 * 1024  # what `dd bs=1M count=9 oflag=direct` wrote to the namespace between the readings


def test_parses_nvme_cli_2_strings():
    before = parse_smart_log((FIX / "null_blk-before.json").read_text())
    after = parse_smart_log((FIX / "null_blk-after-9MiB-written.json").read_text())
    assert (before.data_units_written, after.data_units_written) == (0, 19)
    assert (before.data_units_read, after.data_units_read) == (1, 11)
    assert after.host_write_commands == 81


def test_null_blk_namespace_reconciles_with_the_bytes_written():
    before = parse_smart_log((FIX / "null_blk-before.json").read_text())
    after = parse_smart_log((FIX / "null_blk-after-9MiB-written.json").read_text())
    w = smart_writes("/dev/nvme0n1", before, after, NINE_MIB)
    # 18,432 sectors: 18.4 data units, rounded up by the target to 19
    assert w.exposed and w.data_units_written == 19 and w.reconciled is True
    assert w.written_bytes == 19 * DATA_UNIT_BYTES
    # a block count off by more than one data unit does not reconcile, and says so
    off = smart_writes("/dev/nvme0n1", before, after, NINE_MIB + 2 * DATA_UNIT_BYTES)
    assert off.exposed and off.reconciled is False and "data units" in off.note


def test_file_backed_nvmet_namespace_is_not_exposed_never_zero_written():
    zero = parse_smart_log((FIX / "file-after-9MiB-written.json").read_text())
    w = smart_writes("/dev/nvme0n1", zero, zero, NINE_MIB)
    assert not w.exposed and w.data_units_written is None and w.note.startswith("not exposed")
    assert "file" in w.note


def test_a_device_that_does_not_answer_is_not_exposed():
    err = (FIX / "not-nvme.stderr").read_text().splitlines()[0]
    w = smart_writes("/dev/vda", None, None, 4096, error=err)
    assert not w.exposed and "No such file" in w.note and w.to_dict()["written_bytes"] is None
    assert not smart_writes(None, None, None, 4096).exposed


@pytest.mark.parametrize("text", ["", "Smart Log for NVME device:nvme0", "[]", '{"data_units_written": -1}',
                                  '{"data_units_read": "1", "data_units_written": true}'])
def test_other_shapes_are_refused(text):
    with pytest.raises(ValueError):
        parse_smart_log(text)


def test_the_text_output_is_refused_too():
    with pytest.raises(ValueError):
        parse_smart_log((FIX / "null_blk-after.txt").read_text())


@pytest.mark.parametrize("dev, ns", [("/dev/nvme0n1", "/dev/nvme0n1"), ("/dev/nvme1n2p3", "/dev/nvme1n2"),
                                     ("/dev/loop0", None), ("/dev/mapper/vg-kv", None), (None, None)])
def test_which_device_is_asked(dev, ns):
    assert smart_device(dev) == ns
