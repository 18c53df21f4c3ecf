#!/bin/bash
# The verifier: reward 1 when the task is done, else 0.
mkdir -p /logs/verifier
if [ "$(cat /app/sorted.txt 2>/dev/null)" = "$(printf "alice\nbob\ncarol\nmallory\ntrent")" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
