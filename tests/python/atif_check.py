"""Loads every trajectory of a forgelog ATIF export with Harbor's own models
(harbor.models.trajectories, which validate the schema), and prints what they
hold as JSON: per document its steps' sources, every sampled turn (its own and
its embedded sub-agents'), reward and sub-agent count."""

import json
import pathlib
import sys

from harbor.models.trajectories import Trajectory


def sampled(t):
    turns = [
        {
            "call_index": s.metrics.extra["call_index"],
            "completion_token_ids": s.metrics.completion_token_ids,
            "prompt_tokens": s.metrics.prompt_tokens,
            "logprobs": s.metrics.logprobs,
        }
        for s in t.steps
        if s.metrics is not None
    ]
    for sub in t.subagent_trajectories or []:
        turns += sampled(sub)
    return turns


out = {}
for path in sorted(pathlib.Path(sys.argv[1]).glob("*/*.json")):
    t = Trajectory.model_validate_json(path.read_text())
    out[f"{path.parent.name}/{path.stem}"] = {
        "schema_version": t.schema_version,
        "session_id": t.session_id,
        "sources": [s.source for s in t.steps],
        "sampled": sampled(t),
        "reward": (t.extra or {}).get("reward"),
        "subagents": len(t.subagent_trajectories or []),
    }
print(json.dumps(out))
