"""Loads an SFT JSONL export with Hugging Face `datasets`, offline, as a user would.
Usage: load_sft.py FILE.jsonl CACHE_DIR. Prints {"rows", "columns", "roles"} (roles of row 0)."""
import json
import os
import sys

path, cache = sys.argv[1], sys.argv[2]
os.environ["HF_DATASETS_CACHE"] = cache
os.environ["HF_HUB_OFFLINE"] = "1"
import datasets  # noqa: E402  (reads the environment at import)

ds = datasets.load_dataset("json", data_files=path, split="train", cache_dir=cache)
print(json.dumps({"rows": len(ds), "columns": ds.column_names, "roles": [m["role"] for m in ds[0]["messages"]]}))
