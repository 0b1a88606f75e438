"""The one facts command per node: its framed output splits back into each fact's own stdout, stderr and exit
status, byte for byte, and a command cut short leaves what it printed as data."""

import pytest

from harness.execute.facts import FACTS, facts_argv, node_facts, section_result
from harness.parsers.facts import SECTION_MARK, parse_fact_sections
from harness.transport.base import CommandResult

M = SECTION_MARK


def framed(*sections):
    """stdout, stderr as the facts script prints them for (key, stdout, stderr, rc, t0, t1) sections."""
    out = err = ""
    for key, so, se, rc, t0, t1 in sections:
        out += f"{M} begin {key} t={t0}\n{so}\n{M} end {key} rc={rc} t={t1}\n"
        err += f"{M} begin {key}\n{se}\n{M} end {key}\n"
    return out, err


@pytest.mark.parametrize("body", ["", "\n", "no newline at the end", "a\nb\n", "a\n\n\n",
                                  f"a line that mentions {M} end other rc=0\n"])
def test_each_section_comes_back_byte_for_byte(body):
    out, err = framed(("k", body, body[::-1], 3, "1.5", "2.25"))
    s = parse_fact_sections(out, err)["k"]
    assert (s.stdout, s.stderr, s.rc, s.complete) == (body, body[::-1], 3, True)
    assert s.duration_s == pytest.approx(0.75)


def test_a_key_that_starts_another_keys_name_is_not_cut_short():
    out, err = framed(("nvme_list", "A", "", 1, "1", "2"), ("nvme_list_subsys", "B", "x", 0, "2", "3"))
    # The first section's body holds text that looks like the start of the second key's end marker.
    out = out.replace("A\n", f"A\n\n{M} end nvme_list_subsys rc=0 t=9\nA2\n", 1)
    s = parse_fact_sections(out, err)
    assert s["nvme_list"].stdout == f"A\n\n{M} end nvme_list_subsys rc=0 t=9\nA2"
    assert (s["nvme_list_subsys"].stdout, s["nvme_list_subsys"].stderr, s["nvme_list_subsys"].rc) == ("B", "x", 0)


def test_noise_outside_the_frames_is_ignored_and_a_cut_section_keeps_its_output():
    out, err = framed(("uname", "Linux x\n", "", 0, "1", "2"))
    out = "motd from a login shell\n" + out + f"{M} begin cpuinfo t=2\nprocessor : 0\nmodel na"
    err = "stty: not a tty\n" + err + f"{M} begin cpuinfo\n"
    s = parse_fact_sections(out, err)
    assert s["uname"].stdout == "Linux x\n" and s["uname"].complete
    cut = s["cpuinfo"]
    assert not cut.complete and cut.rc is None and cut.stdout == "processor : 0\nmodel na"
    assert "meminfo" not in s


def test_a_node_without_date_nanoseconds_still_splits():
    out = f"{M} begin k t=\nx\n{M} end k rc=0 t=\n"
    s = parse_fact_sections(out, "")["k"]
    assert s.stdout == "x" and s.rc == 0 and s.duration_s is None and s.stderr == ""


def whole(stdout="", stderr="", rc=0, timed_out=False, error=None):
    return CommandResult(facts_argv(FACTS), rc, stdout, stderr, 5.0, timed_out, error, "n1")


def test_section_results_as_if_each_fact_had_run_alone():
    fact = next(f for f in FACTS if f.key == "nvidia_smi")  # 60 s limit
    out, err = framed(("nvidia_smi", "", "", 124, "100", "160.01"), ("versions", "{}", "", 0, "160", "160.2"))
    w = whole(out, err)
    s = parse_fact_sections(out, err)
    r = section_result(fact, s["nvidia_smi"], w)
    assert r.argv == fact.argv and r.timed_out and not r.ok  # GNU timeout's 124 after the fact's own limit
    v = section_result(next(f for f in FACTS if f.key == "versions"), s["versions"], w)
    assert v.ok and v.stdout == "{}" and v.duration_s == pytest.approx(0.2)
    quick_124 = section_result(fact, parse_fact_sections(*framed(("nvidia_smi", "", "", 124, "1", "1.1")))["nvidia_smi"], w)
    assert quick_124.rc == 124 and not quick_124.timed_out  # its own exit status, not a timeout


def test_facts_the_command_never_reached_are_errors_naming_why():
    fact = FACTS[-1]
    missing = section_result(fact, None, whole(rc=None, timed_out=True))
    assert missing.error and "ended before this fact ran" in missing.error and missing.timed_out
    unreachable = section_result(fact, None, whole(rc=None, error="could not start: connection closed"))
    assert "could not start" in unreachable.error
    out = f"{M} begin {fact.key} t=1\npartial"
    cut = section_result(fact, parse_fact_sections(out, "")[fact.key], whole(out, rc=-1))
    assert cut.stdout == "partial" and cut.rc is None and "ended inside this fact" in cut.error


def test_the_script_runs_every_fact_once_in_order_under_its_own_limit():
    script = facts_argv(node_facts("/opt/engine/bin/python"))[2]
    lines = [line for line in script.splitlines() if line.startswith("_f ")]
    assert [line.split()[1] for line in lines] == [f.key for f in FACTS]
    assert lines[0] == "_f uname 30 uname -srvmo"
    assert lines[-1].startswith("_f versions 60 /opt/engine/bin/python -c ")
