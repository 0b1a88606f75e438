"""Every bad file in the corpus gives the expected FILE:LINE: path: message, all issues at once."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config import load_config

from harness.workloads import WORKLOADS
from harness.errors import ConfigError

CFG = Path(__file__).parent.parent / "fixtures" / "configs"
BAD = sorted((CFG / "bad").glob("*.yaml"))
EXPECT = re.compile(r"^# expect: (\d+): (\S+): (.+)$")


def expectations(path: Path):
    out = []
    for line in path.read_text().splitlines():
        m = EXPECT.match(line)
        if m:
            out.append((int(m.group(1)), m.group(2), m.group(3)))
    return out


def load(path: Path):
    if path.name.startswith("g"):
        return load_config(CFG / "good_inventory.yaml", path, WORKLOADS)
    return load_config(path, CFG / "good_gates.yaml", WORKLOADS)


def test_corpus_is_large_enough():
    assert len(BAD) >= 15


def test_good_files_validate():
    cfg = load_config(CFG / "good_inventory.yaml", CFG / "good_gates.yaml", WORKLOADS)
    assert [g.id for g in cfg.suite.gates] == ["G1"]
    assert cfg.params["G1"].bs_bytes == 1 << 20


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_file_reports_line_path_and_reason(path):
    want = expectations(path)
    assert want, f"{path.name} has no '# expect:' line"
    with pytest.raises(ConfigError) as ei:
        load(path)
    got = ei.value.issues
    for line, field, text in want:
        match = [i for i in got if i.line == line and (i.path or "<root>") == field and text in i.message]
        assert match, f"expected {path.name}:{line}: {field}: ...{text}...; got:\n" + "\n".join(map(str, got))
        assert str(match[0]).startswith(f"{path}:{line}: {field}: ")
    assert len(got) == len(want), "unexpected extra issues:\n" + "\n".join(map(str, got))


def test_cli_validate_prints_every_error_and_exits_2():
    path = CFG / "bad" / "g18_several_errors.yaml"
    r = subprocess.run([sys.executable, "-m", "harness", "validate", "-i", str(CFG / "good_inventory.yaml"),
                        "-g", str(path)], capture_output=True, text=True)
    assert r.returncode == 2
    lines = [l for l in r.stderr.splitlines() if l.startswith(str(path))]
    assert [l.split(":")[1] for l in lines] == ["7", "8", "10"]
    assert "3 configuration error(s)" in r.stderr


def test_both_files_reported_together(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes:\n  - name: n1\n    transport: telnet\n")
    with pytest.raises(ConfigError) as ei:
        load_config(inv, CFG / "bad" / "g01_unknown_key.yaml", WORKLOADS)
    files = {i.file for i in ei.value.issues}
    assert files == {str(inv), str(CFG / "bad" / "g01_unknown_key.yaml")}
