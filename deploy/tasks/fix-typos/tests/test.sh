#!/bin/bash
# The verifier: reward 1 when the task is done, else 0.
mkdir -p /logs/verifier
if [ "$(cat /app/notes.md)" = "$(printf 'the first line\nkeep the rest as it is\nnothing here\nand the end\n')" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
