"""A LoRA adapter forgelog wrote, applied the way the PyTorch ecosystem
applies one, with nothing of forgelog's: `transformers` loads the base model
folder, `peft`'s PeftModel.from_pretrained the adapter folder on top of it;
their logits are compared with forgelog's at every position, unmerged and
after PEFT's own merge_and_unload.

    python peft_adapter_check.py BASE_DIR ADAPTER_DIR EXPECTED.json

EXPECTED.json: {"ids": [...], "logits": [[...], ...]}, forgelog's forward
of those ids with the adapter. Prints one JSON line; exits non-zero on any
difference. Runs in the torch venv (scripts/torch-env.sh).
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402
from peft import PeftModel  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def max_diff(logits, theirs, what):
    if logits.shape != theirs.shape:
        sys.exit(f"{what}: logits of shape {tuple(logits.shape)}, forgelog's {tuple(theirs.shape)}")
    diff = float((logits - theirs).abs().max())
    scale = float(theirs.abs().max())
    if not diff <= 1e-4 * max(1.0, scale):
        sys.exit(f"{what}: logits differ by up to {diff} (largest logit {scale})")
    return diff


def main():
    base_dir, adapter_dir, expected_path = sys.argv[1:4]
    with open(expected_path) as f:
        expected = json.load(f)
    ids = torch.tensor([expected["ids"]])
    theirs = torch.tensor(expected["logits"], dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    with torch.no_grad():
        base_diff = float((base(ids).logits[0] - theirs).abs().max())
    model = PeftModel.from_pretrained(base, adapter_dir)
    model.eval()
    adapted = sorted({name.rsplit(".lora_", 1)[0] for name, _ in model.named_parameters() if ".lora_" in name})
    with torch.no_grad():
        unmerged = max_diff(model(ids).logits[0], theirs, "PEFT unmerged")
        merged_model = model.merge_and_unload()
        merged = max_diff(merged_model(ids).logits[0], theirs, "PEFT merged")
    print(json.dumps({
        "model_class": type(merged_model).__name__,
        "adapted_modules": len(adapted),
        "unmerged_diff": unmerged,
        "merged_diff": merged,
        "base_diff": base_diff,
    }))


if __name__ == "__main__":
    main()
