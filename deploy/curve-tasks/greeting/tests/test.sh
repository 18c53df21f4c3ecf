#!/bin/bash
# The verifier: reward 1 when the task is done, else 0.
mkdir -p /logs/verifier
if [ "$(cat /app/greeting.txt 2>/dev/null)" = "good morning" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
