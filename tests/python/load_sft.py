"""Loads an SFT export with Hugging Face `datasets`, offline, as a user would.
Usage: load_sft.py FILE.jsonl CACHE_DIR, or load_sft.py EXPORT_DIR CONFIG CACHE_DIR
(a config of the export's dataset card: a harness or `all`).
Prints {"rows", "columns", "roles"} (roles of row 0's messages, when it has them)."""
import json
import os
import sys

if len(sys.argv) == 3:
    path, config, cache = sys.argv[1], None, sys.argv[2]
else:
    path, config, cache = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ["HF_DATASETS_CACHE"] = cache
os.environ["HF_HUB_OFFLINE"] = "1"
import datasets  # noqa: E402  (reads the environment at import)

if config is None:
    ds = datasets.load_dataset("json", data_files=path, split="train", cache_dir=cache)
else:
    ds = datasets.load_dataset(path, config, split="train", cache_dir=cache)
row = ds[0]
roles = [m["role"] for m in row["messages"]] if "messages" in row else []
print(json.dumps({"rows": len(ds), "columns": ds.column_names, "roles": roles}))
