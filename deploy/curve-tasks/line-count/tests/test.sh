#!/bin/bash
# The verifier: reward 1 when the task is done, else 0.
mkdir -p /logs/verifier
if [ "$(tr -d "[:space:]" < /app/count.txt 2>/dev/null)" = "23" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
