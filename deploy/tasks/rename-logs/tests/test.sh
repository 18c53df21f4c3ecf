#!/bin/bash
# The verifier: reward 1 when the task is done, else 0.
mkdir -p /logs/verifier
if [ "$(cd /app/logs && ls | tr '\n' ' ')" = "a.txt b.txt c.txt keep.md " ] && [ "$(cat /app/logs/b.txt)" = b ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
