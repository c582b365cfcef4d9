"""Reachability and steering, pure: which nodes a replacement may be scheduled to (as
the scheduler's filters say), the no_fit refusal that names what excluded them, the
webhook configuration the remediator keeps, and the mutation its webhook answers with."""

from __future__ import annotations

import json

from numaguard.remediator.core.steering import mutation, steered_to


def test_the_mutation_and_the_paths_it_answers():
    pod = {"spec": {"containers": []}}
    assert mutation(pod, ("a", "b"), False) == [
        {
            "op": "add",
            "path": "/spec/affinity",
            "value": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 100,
                            "preference": {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": [n]}
                                ]
                            },
                        }
                        for n in ("a", "b")
                    ]
                }
            },
        }
    ]
    assert steered_to("/steer/required/a,b.example") == (True, ("a", "b.example"))
    for path in ("/steer/always/a", "/steer/preferred/A_B", "/steer/preferred/", "/other/x/y"):
        assert steered_to(path) is None, path
    assert steered_to("/steer/preferred/" + ",".join("n" * 8)) is not None
    assert steered_to("/steer/preferred/" + ",".join(f"n{i}" for i in range(9))) is None
    assert json.dumps(mutation(pod, ("a",), True)).count("metadata.name") == 1
