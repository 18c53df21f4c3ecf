//! forgelog-producers: the capture proxy: dialect adapters, upstream adapters, SSE replay, session keys, the verifier reporter.
