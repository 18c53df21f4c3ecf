//! forgelog-trainer: the candle GRPO learner: loss, optimizer, checkpoints, PolicyPublished.
