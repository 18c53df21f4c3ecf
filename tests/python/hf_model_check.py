"""A model folder forgelog exported, read the way the Hugging Face ecosystem
reads it, with nothing of forgelog's: `transformers`' AutoConfig,
AutoTokenizer (its chat template included) and AutoModelForCausalLM (its own
llama/qwen2 forward, in torch, on the CPU).

    python hf_model_check.py MODEL_DIR EXPECTED.json

EXPECTED.json: {"messages": [...], "prompt_ids": [...], "logits": [[...], ...]},
what forgelog's engine renders, tokenizes and computes (at every position)
for those messages.
Prints one JSON line of what it checked; exits non-zero on any difference.
Runs in the torch venv (scripts/torch-env.sh).
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402


def main():
    model_dir, expected_path = sys.argv[1], sys.argv[2]
    with open(expected_path) as f:
        expected = json.load(f)
    config = AutoConfig.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rendered = tokenizer.apply_chat_template(
        expected["messages"], add_generation_prompt=True, tokenize=True
    )
    ids = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
    if ids != expected["prompt_ids"]:
        sys.exit(f"chat template + tokenizer give {ids}, forgelog {expected['prompt_ids']}")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    theirs = torch.tensor(expected["logits"], dtype=torch.float32)
    if logits.shape != theirs.shape:
        sys.exit(f"logits of shape {tuple(logits.shape)}, forgelog's {tuple(theirs.shape)}")
    by_position = (logits - theirs).abs().amax(dim=1)
    diff = float(by_position.max())
    scale = float(theirs.abs().max())
    if not diff <= 1e-4 * max(1.0, scale):
        worst = int(by_position.argmax())
        sys.exit(f"logits differ by up to {diff} at position {worst} (largest logit {scale})")
    print(json.dumps({
        "model_type": config.model_type,
        "architectures": config.architectures,
        "model_class": type(model).__name__,
        "tokenizer": type(tokenizer).__name__,
        "eos_token_id": config.eos_token_id,
        "prompt_tokens": len(ids),
        "positions": len(ids),
        "max_logit_diff": diff,
        "argmax": int(logits[-1].argmax()),
    }))


if __name__ == "__main__":
    main()
