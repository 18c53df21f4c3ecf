#!/bin/bash
# The verifier: reward 1 when the task is done, else 0.
mkdir -p /logs/verifier
if [ "$(cat /app/.env 2>/dev/null)" = "$(printf 'PORT=8080\nMODE=production\nWORKERS=4')" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
