"""Which rig `rig down` / `status` act on: the one `rig up` recorded, and every node namespace of its prefix."""

import json

from harness.rigs.netns import RigSpec, recorded_spec, rig_namespaces


def test_the_recorded_rig_wins_over_the_flags_and_no_record_leaves_the_flags(tmp_path):
    built = RigSpec(prefix="kvz-", node_count=32, state_dir=tmp_path, port_rate_mbit=500)
    (tmp_path / "rig.json").write_text(json.dumps({"spec": {"prefix": "kvz-", "node_count": 32,
                                                            "state_dir": str(tmp_path), "port_rate_mbit": 500,
                                                            "a_field_of_an_older_kvgate": 1}}))
    spec, state = recorded_spec(RigSpec(prefix="kvz-", state_dir=tmp_path))   # default 8 nodes
    assert spec == built and state is not None and len(spec.all_namespaces()) == 34
    (tmp_path / "rig.json").unlink()
    assert recorded_spec(RigSpec(prefix="kvz-", state_dir=tmp_path))[0].node_count == 8


def test_node_namespaces_beyond_the_count_are_the_rigs_but_other_prefixes_are_not():
    spec = RigSpec(prefix="kvg-", node_count=2)
    present = {"kvg-hub", "kvg-st", "kvg-n1", "kvg-n2", "kvg-n10", "kvg-n3", "kvg-nx", "kvg-tn1", "kvgn4", "other"}
    assert rig_namespaces(spec, present) == ["kvg-n1", "kvg-n2", "kvg-st", "kvg-hub", "kvg-n3", "kvg-n10"]
