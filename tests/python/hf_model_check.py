"""A model folder forgelog exported, read the way the Hugging Face ecosystem
reads it, with nothing of forgelog's: `transformers`' AutoConfig and
AutoTokenizer (its chat template included), the `safetensors` weights, and a
numpy llama/qwen2 forward written from `transformers`' modeling code (torch is
not installable in CI; the forward is the same math).

    python hf_model_check.py MODEL_DIR EXPECTED.json

EXPECTED.json: {"messages": [...], "prompt_ids": [...], "last_logits": [...]},
what forgelog's engine renders, tokenizes and computes for those messages.
Prints one JSON line of what it checked; exits non-zero on any difference.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import numpy as np  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from transformers import AutoConfig, AutoTokenizer  # noqa: E402


def rms_norm(x, weight, eps):
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(variance + eps) * weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def forward(config, w, ids):
    """Logits at every position of `ids` (one sequence, causal)."""
    n = len(ids)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    d = getattr(config, "head_dim", None) or config.hidden_size // heads
    rope = getattr(config, "rope_parameters", None) or {"rope_theta": config.rope_theta}
    inv_freq = 1.0 / (rope["rope_theta"] ** (np.arange(0, d, 2, dtype=np.float64) / d))
    angles = np.outer(np.arange(n, dtype=np.float64), inv_freq)
    emb = np.concatenate([angles, angles], axis=-1)
    cos, sin = np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)
    mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), k=1)

    def linear(x, name):
        y = x @ w[name + ".weight"].T
        bias = w.get(name + ".bias")
        return y if bias is None else y + bias

    h = w["model.embed_tokens.weight"][ids]
    for layer in range(config.num_hidden_layers):
        p = f"model.layers.{layer}"
        x = rms_norm(h, w[f"{p}.input_layernorm.weight"], config.rms_norm_eps)
        q = linear(x, f"{p}.self_attn.q_proj").reshape(n, heads, d).transpose(1, 0, 2)
        k = linear(x, f"{p}.self_attn.k_proj").reshape(n, kv_heads, d).transpose(1, 0, 2)
        v = linear(x, f"{p}.self_attn.v_proj").reshape(n, kv_heads, d).transpose(1, 0, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = np.repeat(k, heads // kv_heads, axis=0)
        v = np.repeat(v, heads // kv_heads, axis=0)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(d) + mask
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        attn = (scores @ v).transpose(1, 0, 2).reshape(n, heads * d)
        h = h + linear(attn, f"{p}.self_attn.o_proj")
        x = rms_norm(h, w[f"{p}.post_attention_layernorm.weight"], config.rms_norm_eps)
        gate = linear(x, f"{p}.mlp.gate_proj")
        h = h + linear(gate / (1.0 + np.exp(-gate)) * linear(x, f"{p}.mlp.up_proj"), f"{p}.mlp.down_proj")
    h = rms_norm(h, w["model.norm.weight"], config.rms_norm_eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return h @ head.T


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
    weights = {k: v.astype(np.float32) for k, v in load_file(os.path.join(model_dir, "model.safetensors")).items()}
    logits = forward(config, weights, np.array(ids))[-1]
    theirs = np.array(expected["last_logits"], dtype=np.float32)
    diff = float(np.max(np.abs(logits - theirs)))
    scale = float(np.max(np.abs(theirs)))
    if not diff <= 1e-4 * max(1.0, scale):
        sys.exit(f"logits differ by up to {diff} (largest logit {scale})")
    print(json.dumps({
        "model_type": config.model_type,
        "architectures": config.architectures,
        "tokenizer": type(tokenizer).__name__,
        "eos_token_id": config.eos_token_id,
        "prompt_tokens": len(ids),
        "max_logit_diff": diff,
        "argmax": int(np.argmax(logits)),
    }))


if __name__ == "__main__":
    main()
