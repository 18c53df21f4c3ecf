"""TRL's SFTTrainer trains a step on a forgelog SFT export, loaded with
`datasets` as its dataset card says, on the CPU, in the torch venv
(scripts/torch-env.sh).

- `messages`: `HARNESS/sft.jsonl`, its `messages` and `tools` rendered by the
  model's own chat template (TRL tokenizes them).
- `tokens`: config `HARNESS` of the card (the Parquet), its recorded
  `input_ids` and `labels` (-100 where the model did not sample), as they are.

    python trl_sft_step.py MODEL_DIR EXPORT_DIR HARNESS

Prints {"messages": {...}, "tokens": {...}}: for each, the rows, the optimizer
steps taken, the training loss, how many of the model's tensors the step
changed, and how many tokens the loss covered in the first batch.
"""

import json
import math
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import datasets  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402


def one_step(model_dir, dataset):
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(
            output_dir=out,
            max_steps=1,
            per_device_train_batch_size=2,
            learning_rate=1e-4,
            max_length=None,  # the recorded sequences whole
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            seed=0,
        )
        trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
        batch = next(iter(trainer.get_train_dataloader()))
        trained_tokens = int((batch["labels"] != -100).sum())
        result = trainer.train()
    changed = sum(not torch.equal(before[name], p.detach()) for name, p in model.named_parameters())
    loss = result.training_loss
    if not math.isfinite(loss) or result.global_step != 1 or changed == 0 or trained_tokens == 0:
        sys.exit(f"no real step: loss {loss}, steps {result.global_step}, tensors changed {changed}, "
                 f"tokens in the loss {trained_tokens}")
    return {
        "rows": len(dataset),
        "steps": result.global_step,
        "loss": loss,
        "tensors_changed": changed,
        "tensors": len(before),
        "loss_tokens_first_batch": trained_tokens,
    }


def main():
    model_dir, export_dir, harness = sys.argv[1:4]
    cache = tempfile.mkdtemp()
    jsonl = os.path.join(export_dir, harness, "sft.jsonl")
    messages = datasets.load_dataset("json", data_files=jsonl, split="train", cache_dir=cache)
    tokens = datasets.load_dataset(export_dir, harness, split="train", cache_dir=cache)
    print(json.dumps({
        # `tools` only where a row of the file has tools
        "messages": one_step(model_dir, messages.select_columns(
            [c for c in ("messages", "tools") if c in messages.column_names])),
        "tokens": one_step(model_dir, tokens.select_columns(["input_ids", "labels"])),
    }))


if __name__ == "__main__":
    main()
