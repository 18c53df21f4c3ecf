"""An SFT export's conversations rendered by the model's own chat template, as
TRL's SFTTrainer renders them: `transformers`' AutoTokenizer of a model folder,
`apply_chat_template(messages, tools=...)` on every JSONL row, compared with
the row's recorded `input_ids`.

    python sft_template_check.py MODEL_DIR FILE.jsonl

Prints {"rows", "rendered", "same_tokens", "differences"}: `same_tokens` counts
rows whose recorded ids are the render's ids (up to what the template adds
after the last sampled token); `differences` says, for the others, at which
token and with what text on each side.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from transformers import AutoTokenizer  # noqa: E402

model_dir, path = sys.argv[1], sys.argv[2]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
rows = rendered = same = 0
differences = []
with open(path) as f:
    for line in f:
        row = json.loads(line)
        rows += 1
        out = tokenizer.apply_chat_template(row["messages"], tools=row.get("tools"), tokenize=True)
        ids = list(out["input_ids"] if hasattr(out, "keys") else out)
        rendered += 1
        recorded = row["input_ids"]
        if ids[: len(recorded)] == recorded:
            same += 1
            continue
        at = next(i for i, (a, b) in enumerate(zip(ids + [None] * len(recorded), recorded)) if a != b)
        differences.append({
            "row_id": row["row_id"],
            "at_token": at,
            "template": tokenizer.decode(ids[at : at + 12]),
            "recorded": tokenizer.decode(recorded[at : at + 12]),
        })
print(json.dumps({"rows": rows, "rendered": rendered, "same_tokens": same, "differences": differences}))
