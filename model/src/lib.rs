//! forgelog-model: the policy model: llama/qwen2 code returning logits at every position, weight loading, tokenizer, chat template.
