//! forgelog-engine: a candle inference server that returns sampled token ids and logprobs the way vLLM does.
