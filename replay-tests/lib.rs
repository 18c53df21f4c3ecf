//! Recorded logs and the tests that prove replay is deterministic.
