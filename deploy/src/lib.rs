//! forgelog-deploy: rollout orchestration: task format, local process runner, Kubernetes runner.
