"""The official Qwen3 chat template, as TRL ships it (`trl/chat_templates/
qwen3.jinja`, a byte copy of Qwen3's), rendered by `transformers`'
`apply_chat_template` on a tokenizer folder with that template swapped in.

    python qwen3_template_check.py TOKENIZER_DIR CASES.json

CASES.json: [{"messages": [...], "tools": [...] | null,
"add_generation_prompt": bool}, ...]. Prints {"template": TEXT, "rendered":
[TEXT, ...]}.
"""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import trl  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

tokenizer_dir, cases_path = sys.argv[1], sys.argv[2]
template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
tokenizer.chat_template = template
rendered = [
    tokenizer.apply_chat_template(
        case["messages"],
        tools=case.get("tools"),
        add_generation_prompt=case["add_generation_prompt"],
        tokenize=False,
    )
    for case in json.loads(Path(cases_path).read_text())
]
print(json.dumps({"template": template, "rendered": rendered}))
