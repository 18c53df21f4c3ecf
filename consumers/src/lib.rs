//! forgelog-consumers: trajectory trees, reward join, GRPO groups.
