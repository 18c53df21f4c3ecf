#!/bin/bash
# The verifier: reward 1 when the task is done, else 0.
mkdir -p /logs/verifier
if cmp -s /app/app.conf /app/backup/app.conf; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
